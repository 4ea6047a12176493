/* Shared between the parts of the _native extension (net.c: the op-list interpreter;
 * step.c: the lone-request step, which runs a Program's forward pass in place; scan.c: the
 * lane scan; direct.c: direct connections' plain steps). */
#ifndef RLINKD_NATIVE_H
#define RLINKD_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "declared.h"  /* generated from the Python declarations (rlinkd.daemon.c_headers) */

typedef struct {
    PyObject_HEAD
    int32_t *code;
    Py_ssize_t n_insns;
    float *consts;
    Py_ssize_t n_consts;
    int32_t *width;      /* per register */
    Py_ssize_t n_regs;
    Py_ssize_t n_inputs; /* registers 0..n_inputs-1 */
    int32_t output;
    int32_t state_output; /* a recurrent step's state_out register, or -1 (feed-forward) */
    Py_ssize_t *offset;  /* per register: its column offset in one arena row-block */
    Py_ssize_t row_floats; /* sum of widths */
    float *arena;
    Py_ssize_t arena_rows;
    int ready;           /* __init__ succeeded (nothing runs before) */
    int busy;            /* a LoneStep is using the arena: run() refuses (re-entrancy) */
} Program;

extern PyTypeObject NativeProgramType;
extern PyTypeObject NativeLoneStepType;
extern PyTypeObject NativeDirectType;  /* direct.c */

/* Room in the arena for `rows` rows (-1 with MemoryError set). */
int native_ensure_arena(Program *p, Py_ssize_t rows);
/* The program over the first n rows of the arena (the inputs copied in first). */
void native_execute(Program *p, Py_ssize_t n);
/* pending_lanes(...) (scan.c): the module-level lane scan. */
PyObject *native_pending_lanes(PyObject *module, PyObject *args);

#endif
