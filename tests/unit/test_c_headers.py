"""C declares nothing Python declares: the generated headers are current, and no C file
re-declares a name they declare (a hand-kept copy would drift unseen)."""
from __future__ import annotations

import re

import pytest

from rlinkd.client_lib.protocol import spaces
from rlinkd.daemon import c_headers
from rlinkd.daemon.inference import fastpath
from rlinkd.shm import lanes, ring
from tests.helpers import REPO

C_DIRS = ("daemon/inference/native", "client_lib/c/src", "client_lib/c/include")


def declared_names(text: str) -> set[str]:
    """Names a C text defines: ``#define NAME`` and enum members."""
    names = set(re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M))
    for body in re.findall(r"\benum\s*\w*\s*\{([^}]*)\}", text):
        names |= {m.group(1) for m in re.finditer(r"(?:^|,)\s*(\w+)\s*(?:=[^,]*)?", body.strip())}
    return names - {n for n in names if n.endswith("_H")}  # (include guards)


def redeclared(generated: str, others: dict[str, str]) -> list[tuple[str, str]]:
    mine = declared_names(generated)
    return sorted((path, name) for path, text in others.items() for name in declared_names(text) & mine)


@pytest.mark.parametrize("path", sorted(c_headers.HEADERS))
def test_the_checked_in_header_is_what_the_declarations_give(path):
    assert (REPO / path).read_text() == c_headers.HEADERS[path](), "run `make c-headers`"


@pytest.mark.parametrize("path", sorted(c_headers.HEADERS))
def test_no_c_file_redeclares_a_generated_name(path):
    others = {str(p.relative_to(REPO)): p.read_text() for d in C_DIRS for p in sorted((REPO / d).glob("*.[ch]"))
              if str(p.relative_to(REPO)) not in c_headers.HEADERS}
    assert redeclared(c_headers.HEADERS[path](), others) == []


def test_a_hand_kept_copy_in_c_is_caught():
    generated = c_headers.native_header()
    direct = (REPO / "daemon/inference/native/direct.c").read_text()
    assert redeclared(generated, {"direct.c": direct}) == []
    assert redeclared(generated, {"direct.c": "#define MAX_OBS 17\n" + direct}) == [("direct.c", "MAX_OBS")]
    copy = "enum {\n    P_REQ_SEQ, P_RESP_SEQ, N_POLICY\n};\n"
    assert redeclared(generated, {"direct.c": copy + direct}) == [
        ("direct.c", "N_POLICY"), ("direct.c", "P_REQ_SEQ"), ("direct.c", "P_RESP_SEQ")]


def test_a_changed_python_declaration_changes_the_header(monkeypatch):
    native, client = c_headers.native_header(), c_headers.client_header()
    monkeypatch.setattr(spaces, "SMALL_BOX_SIZE", 17)
    assert "#define MAX_OBS 17 " in c_headers.native_header()
    monkeypatch.setattr(fastpath, "DIRECT_LAYOUT", tuple(reversed(fastpath.DIRECT_LAYOUT)))
    assert c_headers.native_header() != native
    monkeypatch.setattr(lanes, "OP_END", 5)
    assert "RLK_OP_END = 5" in c_headers.client_header() != client


def test_a_header_struct_and_the_offsets_its_module_names_must_agree(monkeypatch):
    monkeypatch.setattr(ring, "TAIL_OFFSET", 72)
    with pytest.raises(ValueError, match="disagree"):
        c_headers.client_header()


def test_a_layout_key_the_message_does_not_declare_is_refused(monkeypatch):
    monkeypatch.setattr(c_headers, "DIRECT_KEYS", (*c_headers.DIRECT_KEYS, (c_headers.serving.Step, "obs")))
    with pytest.raises(ValueError, match="Step declares no field 'obs'"):
        c_headers.native_header()


def test_the_built_extension_agrees_with_python():
    native = pytest.importorskip("rlinkd.daemon.inference._native", reason="extension not built")
    assert native.DIRECT_MAX_EPISODES == fastpath.DIRECT_MAX_EPISODES


# Keys the C client reads that Python writes as plain dict keys (not message fields or
# rendered layouts): each with the one Python file that writes it.
DICT_KEYS = {"epsilon": "daemon/collector/weights.py", "pid": "daemon/supervisor.py",
             "unix_socket": "daemon/supervisor.py"}
C_KEY_READS = re.compile(r'(?:rlk_json_get\([^;]*?|\b(?:str|value|param|size)_field\(\w+, \w+, )"(\w+)"')


def python_json_keys() -> set[str]:
    """Every key Python puts into what the C client reads: message fields (plus "type"),
    the rendered networks (a recurrent one too), spaces, step and lane layouts, the state
    contract."""
    import dataclasses as dc

    from rlinkd.client_lib.protocol import codec, netops, recurrent, serving
    from rlinkd.client_lib.protocol.distributions import components
    from rlinkd.client_lib.protocol.policy_spec import PolicySpec
    from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, MultiDiscrete
    from rlinkd.shm.records import StepLayout

    keys = {"type"}
    for module in (codec, serving):
        for obj in vars(module).values():
            if isinstance(obj, type) and dc.is_dataclass(obj):
                keys |= {f.name for f in dc.fields(obj)}
    spec = PolicySpec(Box((3,), low=-1.0, high=1.0),  # (a mixed action: Slice, Tile, Clip ops)
                      Dict({"a": Discrete(2), "b": Box((2,), low=-1.0, high=1.0)}))
    step = StepLayout.flat(3, 2, 4)
    memory = PolicySpec(Box((3,)), Discrete(2), recurrent="lstm", recurrent_size=4)
    rendered = [netops.network_json(spec.net, components(spec.act_space)), step.to_json(),
                netops.network_json(memory.net, memory.action_components),
                StepLayout.flat(3, 1, 2, state_size=8).to_json(), recurrent.state_contract("lstm", 4, 5),
                lanes.LaneLayout(step).to_json(), Discrete(3).to_json(),
                MultiDiscrete((2, 3)).to_json(), spec.obs_space.to_json()]
    return keys | set().union(*(_keys_of(r) for r in rendered))


def _keys_of(value) -> set[str]:
    if isinstance(value, dict):
        return set(value).union(*(_keys_of(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys_of(v) for v in value))
    return set()


def c_client_key_reads() -> dict[str, set[str]]:
    return {p.name: set(C_KEY_READS.findall(p.read_text()))
            for p in sorted((REPO / "client_lib/c/src").glob("*.c"))}


def test_every_key_the_c_client_reads_is_one_python_writes():
    reads = c_client_key_reads()
    assert sum(map(len, reads.values())) >= 40  # (the pattern finds the C client's lookups)
    declared = python_json_keys()
    for key, path in DICT_KEYS.items():
        assert f'"{key}"' in (REPO / path).read_text(), f"{path} no longer writes {key!r}"
    unknown = {(name, key) for name, keys in reads.items() for key in keys
               if key not in declared and key not in DICT_KEYS}
    assert unknown == set()
    assert "weights_seq_numbers" not in declared  # (a renamed or misspelled key would be caught)
