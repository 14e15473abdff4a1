"""What an arch's kernels file holds, read without a GPU: its SASS archs, its PTX archs, its kernels.

The file is what nvcc wrote (``targets/nvcc.py``): a cubin (one CUDA ELF) or an uncompressed
fatbin (``0xBA55ED50``: a 16-byte header, then entries of kind 2 = ELF or 1 = PTX, each behind its
own header of ``header_size`` bytes whose ``arch`` field is the SM version). The kernel symbols
are the ELF's global ``STT_FUNC`` symbols. ``read`` raises ``ArtifactError`` on anything else, so a
runner can check a plan's kernels exist before it asks the driver to load them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from grokc.core.errors import ArtifactError

FATBIN_MAGIC = 0xBA55ED50
ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
_FATBIN_ELF, _FATBIN_PTX = 2, 1
_STT_FUNC, _STB_GLOBAL = 2, 1


@dataclass(frozen=True)
class KernelsFile:
    sass_archs: tuple[int, ...]   # SM versions with machine code (90 for sm_90)
    ptx_archs: tuple[int, ...]    # compute_XX versions with PTX a newer GPU can JIT-compile
    symbols: frozenset[str]       # kernel entry points


def read(data: bytes, name: str = "kernels file") -> KernelsFile:
    """Parse a cubin or fatbin; ``name`` is the file's name for the one-line error."""
    try:
        if data[:4] == ELF_MAGIC:
            arch, symbols = _elf(data)
            return KernelsFile((arch,), (), symbols)
        if len(data) >= 16 and struct.unpack_from("<I", data, 0)[0] == FATBIN_MAGIC:
            return _fatbin(data)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as e:
        raise ArtifactError(f"{name} is corrupt ({e}); rebuild the artifact") from None
    raise ArtifactError(f"{name} is neither a cubin nor a fatbin; rebuild the artifact")


def _fatbin(data: bytes) -> KernelsFile:
    _, _, header_size, fat_size = struct.unpack_from("<IHHQ", data, 0)
    end = header_size + fat_size
    if end > len(data):
        raise ValueError("truncated fatbin")
    sass, ptx, symbols, off = [], [], set(), header_size
    while off < end:
        kind, _, entry_header, size = struct.unpack_from("<HHIQ", data, off)
        compressed, = struct.unpack_from("<I", data, off + 16)
        arch, = struct.unpack_from("<I", data, off + 28)
        if compressed:
            raise ValueError("compressed fatbin entries are not read")
        payload = data[off + entry_header:off + entry_header + size]
        if len(payload) != size or entry_header == 0:
            raise ValueError("truncated fatbin entry")
        if kind == _FATBIN_ELF:
            elf_arch, names = _elf(payload)
            sass.append(elf_arch)
            symbols |= names
        elif kind == _FATBIN_PTX:
            ptx.append(arch)
        off += entry_header + size
    return KernelsFile(tuple(sorted(sass)), tuple(sorted(ptx)), frozenset(symbols))


def _elf(data: bytes) -> tuple[int, frozenset[str]]:
    """(SM version, function symbols) of a 64-bit little-endian CUDA ELF."""
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF")
    machine, = struct.unpack_from("<H", data, 18)
    if machine != EM_CUDA:
        raise ValueError(f"ELF machine {machine} is not CUDA ({EM_CUDA})")
    flags, = struct.unpack_from("<I", data, 48)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    symbols = set()
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 2 or not entsize:        # SHT_SYMTAB
            continue
        str_off = sections[link][4]
        for k in range(size // entsize):
            st_name, st_info = struct.unpack_from("<IB", data, offset + k * entsize)
            if st_info & 0xF == _STT_FUNC and st_info >> 4 == _STB_GLOBAL:
                symbols.add(data[str_off + st_name:data.index(b"\0", str_off + st_name)].decode())
    return (flags >> 8) & 0xFF, frozenset(symbols)   # CUDA ELF e_flags: the SM version in bits 8..15
