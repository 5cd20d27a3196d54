"""Opening trace files: gzipped or plain, the same bytes (`open_trace`), and low-level read failures as
`TraceError`s that name the file (`read_error`). Every reader (`kineto`, `nccl_log`, `chakra`) uses these."""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import BinaryIO

from traffic.workload import TraceError

GZIP_MAGIC = b"\x1f\x8b"


def open_trace(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when it starts with the gzip magic."""
    try:
        f = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open ({exc.strerror or exc})") from None
    if f.read(2) == GZIP_MAGIC:
        f.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def read_error(path: Path, exc: BaseException) -> TraceError:
    """A TraceError for a low-level read failure (truncated gzip, bad JSON, undecodable bytes)."""
    if isinstance(exc, EOFError):
        what = "truncated: the compressed stream ends before its end marker"
    elif isinstance(exc, (gzip.BadGzipFile, zlib.error)):
        what = f"corrupt gzip data ({exc})"
    elif isinstance(exc, UnicodeDecodeError):
        what = f"undecodable bytes at offset {exc.start} ({exc.reason})"
    else:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        what = f"{type(exc).__name__}: {first}"
    return TraceError(f"{path}: {what}")
