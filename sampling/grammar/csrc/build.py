"""cffi build script for the C automaton loops (setup.py's cffi_modules): the extension module
`_cobatch_automaton`, top-level so that it is found whether `sampling` is imported from the
source tree or from an installed copy."""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = (HERE / "automaton.h").read_text()

ffibuilder = FFI()
ffibuilder.cdef("\n".join(line for line in HEADER.splitlines() if not line.startswith("#include")))
ffibuilder.set_source(
    "_cobatch_automaton",
    '#include "automaton.h"',
    sources=[str(HERE / "automaton.c")],
    include_dirs=[str(HERE)],
    extra_compile_args=["-O2", "-std=c99"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
