"""docs/c-client.md's C++ and C# snippets for the C client compile against client_lib/c/include/rlinkd.h
(C# only where `mcs` is installed; the C++ check needs g++, which the C client's tests need anyway),
and its CMake project (what engine projects add) configures and builds where cmake is installed."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers import REPO

SECTION = (REPO / "docs" / "c-client.md").read_text(encoding="utf-8")


def snippet(language: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", SECTION, flags=re.S)
    assert len(blocks) == 1, f"expected one {language} block in the C client section"
    return blocks[0]


def test_the_cpp_snippet_compiles(tmp_path):
    source = tmp_path / "snippet.cpp"
    source.write_text(snippet("cpp"))
    subprocess.run(["g++", "-std=c++11", "-Wall", "-Werror", "-fsyntax-only",
                    f"-I{REPO / 'client_lib' / 'c' / 'include'}", str(source)],
                   check=True, capture_output=True, timeout=60)


def test_the_csharp_snippet_compiles(tmp_path):
    if shutil.which("mcs") is None:
        pytest.skip("mcs (mono-mcs) is not installed")
    source = tmp_path / "Snippet.cs"
    source.write_text(snippet("csharp"))
    subprocess.run(["mcs", "-target:library", f"-out:{tmp_path / 'Snippet.dll'}", str(source)],
                   check=True, capture_output=True, timeout=120)


def test_the_csharp_struct_matches_rlk_options(tmp_path):
    """The snippet's RlkOptions is passed by reference to C: its size must be rlk_options's."""
    if shutil.which("mcs") is None or shutil.which("mono") is None:
        pytest.skip("mcs/mono (mono-mcs) is not installed")
    probe_c = tmp_path / "size.c"
    probe_c.write_text('#include <stdio.h>\n#include "rlinkd.h"\n'
                       'int main(void) { printf("%zu\\n", sizeof(rlk_options)); return 0; }\n')
    subprocess.run(["cc", f"-I{REPO / 'client_lib' / 'c' / 'include'}", str(probe_c), "-o", str(tmp_path / "size")],
                   check=True, capture_output=True, timeout=60)
    c_size = subprocess.run([str(tmp_path / "size")], check=True, capture_output=True, text=True).stdout.strip()
    source = tmp_path / "Probe.cs"
    source.write_text(snippet("csharp") + "\npublic static class Probe { public static void Main() {"
                      " System.Console.WriteLine(Marshal.SizeOf(typeof(RlkOptions))); } }\n")
    subprocess.run(["mcs", f"-out:{tmp_path / 'Probe.exe'}", str(source)], check=True, capture_output=True,
                   timeout=120)
    cs_size = subprocess.run(["mono", str(tmp_path / "Probe.exe")], check=True, capture_output=True,
                             text=True, timeout=60).stdout.strip()
    assert cs_size == c_size


def test_the_cmake_project_builds(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    source = REPO / "client_lib" / "c"
    subprocess.run(["cmake", "-S", str(source), "-B", str(tmp_path), "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True, timeout=120)
    subprocess.run(["cmake", "--build", str(tmp_path), "-j", "2"], check=True, capture_output=True, timeout=300)
    for name in ("librlinkd.a", "librlinkd.so", "rlinkd_cartpole"):
        assert (tmp_path / name).exists(), name


def cmake(*args: str) -> None:
    proc = subprocess.run(["cmake", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_an_outside_project_builds_the_documented_way(tmp_path):
    """The page's CMake project and its one_agent.c, outside the repository: once with
    add_subdirectory(<client_lib/c> rlinkd) (examples off), once with find_package after
    `cmake --install`; the installed pkg-config file names the include dir and -lm -pthread."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    source = REPO / "client_lib" / "c"
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(snippet("cmake"))
    one_agent = re.search(r"```c\n(/\* one_agent\.c .*?)```", SECTION, flags=re.S)
    assert one_agent, "no one_agent.c block"
    (project / "one_agent.c").write_text(one_agent.group(1))
    cmake("-S", str(project), "-B", str(tmp_path / "sub"), f"-DRLINKD_SOURCE={source}")
    cmake("--build", str(tmp_path / "sub"), "-j", "2")
    assert (tmp_path / "sub" / "one_agent").exists()
    assert not list((tmp_path / "sub").rglob("rlinkd_cartpole")), "RLINKD_BUILD_EXAMPLES=OFF built the example"
    prefix = tmp_path / "prefix"
    cmake("-S", str(source), "-B", str(tmp_path / "lib"), f"-DCMAKE_INSTALL_PREFIX={prefix}",
          "-DRLINKD_BUILD_EXAMPLES=OFF")
    cmake("--build", str(tmp_path / "lib"), "-j", "2")
    cmake("--install", str(tmp_path / "lib"))
    cmake("-S", str(project), "-B", str(tmp_path / "found"), "-DRLINKD_INSTALLED=ON", f"-DCMAKE_PREFIX_PATH={prefix}")
    cmake("--build", str(tmp_path / "found"))
    assert (tmp_path / "found" / "one_agent").exists()
    pc = next(prefix.rglob("rlinkd.pc")).read_text()
    assert f"includedir={prefix}/include" in pc and "-lm -pthread" in pc
