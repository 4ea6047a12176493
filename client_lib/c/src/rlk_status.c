/* rlk_status.c - status names (contract in rlinkd.h). Its own file: every layer that
 * reports an error calls it, and it calls nothing. */
#include "rlinkd.h"

const char *rlk_status_name(rlk_status s) {
    static const char *const names[] = {"RLK_OK", "RLK_E_ARG", "RLK_E_CONNECT", "RLK_E_IO",
                                        "RLK_E_PROTOCOL", "RLK_E_SERVER", "RLK_E_LIMIT", "RLK_E_NOMEM",
                                        "RLK_E_STATE", "RLK_E_TIMEOUT", "RLK_E_UNSUPPORTED"};
    int i = -(int)s;
    return i >= 0 && i < (int)(sizeof names / sizeof names[0]) ? names[i] : "RLK_E_UNKNOWN";
}
