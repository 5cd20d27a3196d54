"""Hostile sizes in NCCL COLL logs and Chakra traces: a negative size, or a collective above 2^48 bytes
(`traffic.workload.MAX_COLLECTIVE_BYTES`), is refused where it is read. Each input goes through the CLI entry
point in-process (`fabriclab.cli.main(["trace", "show", FILE])`), which must return 2 with
`fabriclab: error: FILE...` naming the event (file:line for a log, the node's id and name for Chakra) and no
traceback. (Kineto's sizes are tested with the Kineto reader.)"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf.internal.encoder import _VarintBytes

from fabriclab.cli import main
from traffic.traces import chakra_et_pb2 as pb
from traffic.workload import MAX_COLLECTIVE_BYTES

FP32, BF16 = 7, 9  # NCCL datatype codes: 4 and 2 bytes per element


def run_cli(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["trace", "show", str(path)])
    return code, capsys.readouterr().err


def refused(path: Path, capsys: pytest.CaptureFixture[str], *named: str) -> None:
    """The CLI exits 2 with one `fabriclab: error:` line naming the file and each of `named`."""
    code, err = run_cli(path, capsys)
    assert code == 2, err
    assert err.startswith(f"fabriclab: error: {path}") and "Traceback" not in err
    for text in named:
        assert text in err, (text, err)


# --- NCCL logs ---------------------------------------------------------------------------------------------------

def nccl_line(op: str = "AllReduce", count: str = "1024", datatype: int = FP32, nranks: str = "2",
              pid: str = "4001") -> str:
    return (f"node1:{pid}:4101 [0] NCCL INFO {op}: opCount 1b sendbuff 0x7f1000000000 recvbuff 0x7f1000400000 "
            f"count {count} datatype {datatype} op 0 root 0 comm 0x55d100000010 [nranks={nranks}] "
            "stream 0x55d100000100\n")


def nccl_log(tmp_path: Path, bad_line: str) -> Path:
    """A log whose line 3 is `bad_line`, after a non-collective line and a good collective."""
    log = tmp_path / "job.log"
    log.write_text("node1:4001:4001 [0] NCCL INFO Bootstrap : Using eth0:198.18.0.1<0>\n" + nccl_line() + bad_line)
    return log


def test_nccl_negative_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # before sizes were checked, `count -5` did not match the line's pattern: refused, but as "does not parse"
    log = nccl_log(tmp_path, nccl_line(count="-5"))
    refused(log, capsys, f"{log}:3: AllReduce opCount 1b count -5 x float32", "negative size (-20 bytes)")


def test_nccl_negative_count_in_a_per_rank_collective(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = nccl_log(tmp_path, nccl_line("AllGather", count="-1", datatype=BF16))
    refused(log, capsys, f"{log}:3: AllGather opCount 1b count -1 x bfloat16 x nranks 2", "negative size (-4 bytes)")


def test_nccl_count_above_2_48_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    count = MAX_COLLECTIVE_BYTES // 4 + 1  # fp32: 4 bytes more than 2^48
    log = nccl_log(tmp_path, nccl_line(count=str(count)))
    refused(log, capsys, f"{log}:3: AllReduce opCount 1b count {count} x float32",
            f"{4 * count} bytes is more than the 2^48 bytes")


def test_nccl_size_above_2_48_bytes_only_once_multiplied_by_nranks(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # AllGather's count is per rank: 2^46 bf16 elements are 2^47 bytes a rank, x 4 ranks = 2^49 bytes
    log = nccl_log(tmp_path, nccl_line("AllGather", count=str(2**46), datatype=BF16, nranks="4"))
    refused(log, capsys, f"{log}:3: AllGather opCount 1b count {2**46} x bfloat16 x nranks 4",
            f"{2**49} bytes is more than the 2^48 bytes")


def test_nccl_exactly_2_48_bytes_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = nccl_log(tmp_path, nccl_line(count=str(MAX_COLLECTIVE_BYTES // 4)))
    code, err = run_cli(log, capsys)
    assert code == 0, err


def test_nccl_count_of_thousands_of_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # int() refuses decimals of 4300+ digits with a ValueError: it must still be a named size error
    log = nccl_log(tmp_path, nccl_line(count="9" * 5000))
    refused(log, capsys, f"{log}:3: AllReduce opCount 1b count 999", "a count of 5000 digits",
            "more than the 2^48 bytes")
    log = nccl_log(tmp_path, nccl_line(count="-" + "9" * 5000))
    refused(log, capsys, f"{log}:3:", "a count of 5000 digits (negative")


def test_nccl_other_numbers_of_thousands_of_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = nccl_log(tmp_path, nccl_line(pid="7" * 5000))
    refused(log, capsys, f"{log}:3: a number too long to read")


@pytest.mark.parametrize("nranks", ["0", str(2**20 + 1), "4000000000"])
def test_nccl_communicator_size_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str], nranks: str) -> None:
    # [nranks=4000000000] would otherwise build a 4e9-rank tuple for the communicator
    log = nccl_log(tmp_path, nccl_line(nranks=nranks))
    refused(log, capsys, f"{log}:3: AllReduce opCount 1b: nranks={nranks}")


# --- Chakra ------------------------------------------------------------------------------------------------------

def chakra_trace(tmp_path: Path, **comm_size: Any) -> Path:
    """A one-collective Chakra trace: metadata, then device all-reduce node 7 'ncclDevKernel_AllReduce' whose
    comm_size attribute holds `comm_size` (e.g. int64_val=-1)."""
    meta = pb.GlobalMetadata(attr=[pb.AttributeProto(name="schema", string_val="1.0.2-chakra.0.0.4")])
    node = pb.Node(id=7, name="ncclDevKernel_AllReduce", type=pb.COMM_COLL_NODE, duration_micros=10)
    node.attr.extend([pb.AttributeProto(name="is_cpu_op", bool_val=False),
                      pb.AttributeProto(name="comm_type", int64_val=pb.ALL_REDUCE),
                      pb.AttributeProto(name="comm_size", **comm_size)])
    path = tmp_path / "rank0.et"
    path.write_bytes(b"".join(_VarintBytes(len(m)) + m for m in (meta.SerializeToString(), node.SerializeToString())))
    return path


NODE = "COLL node 7 'ncclDevKernel_AllReduce'"


def test_chakra_negative_comm_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = chakra_trace(tmp_path, int64_val=-1)
    refused(path, capsys, f"{path}: {NODE}", "all_reduce comm_size: negative size (-1 bytes)")


@pytest.mark.parametrize("value", [{"int64_val": MAX_COLLECTIVE_BYTES + 1}, {"uint64_val": 2**64 - 1},
                                   {"double_val": 1e300}])
def test_chakra_comm_size_above_2_48_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           value: dict[str, Any]) -> None:
    path = chakra_trace(tmp_path, **value)
    refused(path, capsys, f"{path}: {NODE}", "bytes is more than the 2^48 bytes a collective may have")


def test_chakra_exactly_2_48_bytes_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(chakra_trace(tmp_path, int64_val=MAX_COLLECTIVE_BYTES), capsys)
    assert code == 0, err
