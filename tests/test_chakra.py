"""The Chakra execution-trace reader: the real ResNet-50 trace against numbers read off the file by other
means, malformed inputs made from it, synthetic timed traces, and the generated protobuf code."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.internal.decoder import _DecodeVarint32
from google.protobuf.internal.encoder import _VarintBytes

from tests.real_traces import CHAKRA, MARKER, needs
from traffic.traces import chakra_et_pb2 as pb
from traffic.traces.chakra import read_chakra
from traffic.workload import TraceError, Workload

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def real(request: pytest.FixtureRequest) -> Path:
    """The real Chakra trace, for a test marked `@needs(CHAKRA)` (the shared-trace rule, tests/real_traces.py)."""
    assert any(CHAKRA in m.args for m in request.node.iter_markers(MARKER)), "mark the test @needs(CHAKRA)"
    return CHAKRA


# --- helpers: split and write length-prefixed streams with protobuf's own varint codec -------------------

def split(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size, pos = _DecodeVarint32(data, pos)
        out.append(data[pos:pos + size])
        pos += size
    return out


def join(messages: list[bytes]) -> bytes:
    return b"".join(_VarintBytes(len(m)) + m for m in messages)


def attr(name: str, **value: Any) -> pb.AttributeProto:
    return pb.AttributeProto(name=name, **value)


def node(node_id: int, name: str, ntype: pb.NodeType, start_us: int = 0, duration_us: int = 0,
         attrs: tuple[pb.AttributeProto, ...] = (), input_types: str = "") -> bytes:
    n = pb.Node(id=node_id, name=name, type=ntype, start_time_micros=start_us, duration_micros=duration_us)
    n.inputs.types = input_types
    n.attr.extend(attrs)
    return n.SerializeToString()


def coll(node_id: int, comm_type: int, size_bytes: int, start_us: int = 0, duration_us: int = 0,
         *extra: pb.AttributeProto) -> bytes:
    return node(node_id, f"ncclDevKernel_{comm_type}", pb.COMM_COLL_NODE, start_us, duration_us,
                (attr("is_cpu_op", bool_val=False), attr("comm_type", int64_val=comm_type),
                 attr("comm_size", int64_val=size_bytes)) + extra)


def kernel(node_id: int, start_us: int, duration_us: int) -> bytes:
    return node(node_id, "sm80_xmma_gemm", pb.COMP_NODE, start_us, duration_us, (attr("is_cpu_op", bool_val=False),))


META = pb.GlobalMetadata(attr=[attr("schema", string_val="1.0.2-chakra.0.0.4")]).SerializeToString()


def write(path: Path, messages: list[bytes]) -> Path:
    path.write_bytes(join(messages))
    return path


def read_or_trace_error(path: Path) -> Workload | TraceError:
    try:
        return read_chakra(path)
    except TraceError as e:
        return e


# --- the real trace -----------------------------------------------------------------------------------------

# Expected values, read off the file independently of the parser and of this repository's .proto:
#   1. a throwaway script split the stream at its varint length prefixes (hand-decoded varints) and wrote
#      each record back prefixed with the byte 0x0a (field 1, length-delimited), so that the whole stream
#      became one message;
#   2. Debian's protoc 3.21.12 (`protoc --decode_raw < wrapped.bin`) printed it as untyped fields;
#   3. grep/awk over that text: 3665 records = 1 metadata + 3664 nodes; 21 with top-level `3: 7` (COLL);
#      7 of them carry attributes named "comm_type"/"comm_size" (value field 9 = int64_val) and have
#      `27: 0` (is_cpu_op false), the other 14 are `c10d::broadcast_`/`c10d::allreduce_` host ops with
#      `27: 1` and no comm_size; no record has field 6 (start_time_micros); the 7 device COLL nodes, in
#      file order, are (id, comm_type, comm_size, field 7 = duration_micros, inputs field 3 = types):
EXPECTED = [  # (node id, kind from comm_type, comm_size bytes, duration_us, input tensor type -> dtype)
    (435, "broadcast", 212480, 28.0, "float32"),  # comm_type 5, inputs.types ['Tensor(float)']
    (622, "broadcast", 424, 5.0, "int64"),  # comm_type 5, inputs.types ['Tensor(long int)']
    (3256, "all_reduce", 8196000, 5572.0, "float32"),  # comm_type 0
    (3512, "all_reduce", 31502336, 9093.0, "float32"),
    (3686, "all_reduce", 26255360, 8512.0, "float32"),
    (4486, "all_reduce", 26550272, 8178.0, "float32"),
    (5700, "all_reduce", 9724160, 5327.0, "float32"),
]
# A second, outside check of the all-reduce bytes: torchvision's ResNet-50 has 25,557,032 parameters
# (its model card); DDP all-reduces every fp32 gradient once per step: 25,557,032 x 4 bytes.
RESNET50_PARAMS = 25_557_032


@needs(CHAKRA)
def test_real_trace_collectives_kinds_sizes_and_order(real: Path) -> None:
    w = read_chakra(real)
    assert (w.format, w.name, w.source) == ("chakra", "resnet50_ddp_rank0", str(real))
    colls = list(w.collectives())
    assert [(c.kind, c.size_bytes, c.duration_us, c.dtype) for c in colls] == [e[1:] for e in EXPECTED]
    assert all(c.name.startswith("ncclKernel_") for c in colls)
    assert {c.stream for c in colls} == {"14"}  # the device tid (`9: 14`) of every NCCL kernel
    step = w.ranks[0].steps[0]
    assert step.bytes_by_kind() == {"broadcast": (2, 212480 + 424), "all_reduce": (5, RESNET50_PARAMS * 4)}


@needs(CHAKRA)
def test_real_trace_is_untimed_and_says_what_it_assumed(real: Path) -> None:
    w = read_chakra(real)
    assert not w.timed and w.steps == 1 and len(w.ranks) == 1 and w.ranks[0].rank == 0
    step = w.ranks[0].steps[0]
    assert step.number == 0 and step.duration_us is None and step.compute == ()
    assert all(c.start_us is None for c in step.collectives)
    assert w.world_size == 1 and {c.group_ranks for c in step.collectives} == {(0,)}
    notes = " ".join(w.notes)
    assert "no start times" in notes and "3664 nodes" in notes
    # 1209 device COMP nodes (`3: 4` with `27: 0`) whose field 7 sums to 292828 us (same awk over decode_raw)
    assert "1209 device compute nodes, 292828 us" in notes
    assert "14 host-side COLL nodes" in notes
    assert "neither the world size nor its rank" in notes


@needs(CHAKRA)
def test_real_trace_maps_onto_a_data_parallel_job(real: Path) -> None:
    w = read_chakra(real).mapped_to(16)
    assert w.world_size == 16 and len(w.ranks) == 16
    assert {c.group_ranks for c in w.collectives()} == {tuple(range(16))}
    given = read_chakra(real, world_size=8)
    assert given.world_size == 8 and {c.group_ranks for c in given.collectives()} == {tuple(range(8))}
    assert any("taken as rank 0 of 8" in n for n in given.notes)


# --- malformed inputs made from the real trace --------------------------------------------------------------

def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.et"
    p.write_bytes(b"")
    with pytest.raises(TraceError, match=r"empty\.et: empty file"):
        read_chakra(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nothere.et: cannot open"):
        read_chakra(tmp_path / "nothere.et")


@needs(CHAKRA)
@pytest.mark.parametrize("keep", [1, 60, 96, 1_000_000, -1])
def test_truncated_stream(real: Path, tmp_path: Path, keep: int) -> None:
    # 1 and 60 cut the 94-byte metadata; 96 cuts the first node's 2-byte length prefix (bytes 95-96);
    # 1_000_000 and -1 cut a node's body (none of these is a record boundary)
    data = real.read_bytes()
    p = tmp_path / "cut.et"
    p.write_bytes(data[:keep])
    with pytest.raises(TraceError, match=r"cut\.et: truncated"):
        read_chakra(p)


@needs(CHAKRA)
def test_flipped_bytes_in_a_node(real: Path, tmp_path: Path) -> None:
    data = bytearray(real.read_bytes())
    meta_size, first_node = _DecodeVarint32(data, 0)
    first_node += meta_size  # where the first node's length prefix starts
    _, body = _DecodeVarint32(data, first_node)
    data[body:body + 4] = b"\xff\xff\xff\xff"  # tag 0xff: wire type 7 does not exist
    p = tmp_path / "flipped.et"
    p.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=rf"flipped\.et: garbage at byte {first_node}: not a Chakra Node"):
        read_chakra(p)


@needs(CHAKRA)
def test_garbage_files(real: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.et"
    text.write_bytes(b"this is not a trace, only some text\n" * 40)
    with pytest.raises(TraceError, match=r"notes\.et: "):
        read_chakra(text)
    tail = tmp_path / "tail.et"
    tail.write_bytes(real.read_bytes() + b"\xff" * 12)  # an endless varint where the next prefix should be
    with pytest.raises(TraceError, match=rf"tail\.et: garbage at byte {real.stat().st_size}: not a length prefix"):
        read_chakra(tail)


@needs(CHAKRA)
def test_random_corruption_gives_trace_error_or_workload(real: Path, tmp_path: Path) -> None:
    data = real.read_bytes()
    rng = random.Random(20261130)
    p = tmp_path / "fuzz.et"
    for _ in range(40):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        p.write_bytes(bytes(corrupt))
        got = read_or_trace_error(p)  # anything else escaping fails the test
        assert isinstance(got, (Workload, TraceError))


@needs(CHAKRA)
def test_no_collectives(real: Path, tmp_path: Path) -> None:
    meta, *nodes = split(real.read_bytes())
    parsed = [pb.Node.FromString(n) for n in nodes]
    no_coll = [n.SerializeToString() for n in parsed if n.type != pb.COMM_COLL_NODE]
    with pytest.raises(TraceError, match=r"nocoll\.et: no collectives: none of its 3643 nodes"):
        read_chakra(write(tmp_path / "nocoll.et", [meta] + no_coll))
    host_only = [n.SerializeToString() for n in parsed
                 if n.type != pb.COMM_COLL_NODE or not any(a.name == "comm_size" for a in n.attr)]
    with pytest.raises(TraceError, match="14 host-side COLL nodes"):
        read_chakra(write(tmp_path / "hostonly.et", [meta] + host_only))


@needs(CHAKRA)
def test_coll_node_without_comm_size(real: Path, tmp_path: Path) -> None:
    meta, *nodes = split(real.read_bytes())
    out = [meta]
    for raw in nodes:
        n = pb.Node.FromString(raw)
        if n.id == 435:
            kept = [a for a in n.attr if a.name != "comm_size"]
            del n.attr[:]
            n.attr.extend(kept)
        out.append(n.SerializeToString())
    with pytest.raises(TraceError, match=r"nosize\.et: COLL node 435 'ncclKernel_Broadcast.*no comm_size"):
        read_chakra(write(tmp_path / "nosize.et", out))


def test_bad_comm_type(tmp_path: Path) -> None:
    p = write(tmp_path / "type.et", [META, coll(1, 42, 1024)])
    with pytest.raises(TraceError, match="comm_type 42 is not a Chakra CollectiveCommType"):
        read_chakra(p)


# --- synthetic timed traces ---------------------------------------------------------------------------------

PG_INIT = ('[\'[{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "ranks": [], '
           '"group_size": 4, "group_count": 2}, {"pg_name": "1", "pg_desc": "tp", "backend_config": "cuda:nccl", '
           '"ranks": [0, 1], "group_size": 2, "group_count": 2}]\']')


def timed_trace(path: Path) -> Path:
    pg_init = pb.Node(id=2, name="## process_group:init ##", type=pb.METADATA_NODE)
    pg_init.inputs.values = PG_INIT
    cpu = (attr("is_cpu_op", bool_val=True),)
    return write(path, [
        META, pg_init.SerializeToString(),
        node(3, "ProfilerStep#5", pb.COMP_NODE, 1000, 900, cpu),
        node(4, "aten::conv2d", pb.COMP_NODE, 1010, 500, cpu),  # a CPU op: not compute
        kernel(5, 1100, 200), kernel(6, 1250, 150),  # overlap: one interval 1100..1400
        coll(7, pb.ALL_REDUCE, 4096, 1500, 300, attr("pg_name", string_val="0"), attr("stream", int64_val=20),
             attr("dtype", string_val="c10::BFloat16")),
        coll(8, pb.ALL_GATHER, 2048, 1450, 50, attr("pg_name", string_val="1")),  # issued before node 7
        kernel(9, 1950, 100),  # runs across the step boundary at 2000
        node(10, "ProfilerStep#6", pb.COMP_NODE, 2000, 500, cpu),
        kernel(11, 2100, 100),
        coll(12, pb.REDUCE_SCATTER_BLOCK, 8192, 2300, 400, attr("pg_name", string_val="0")),
        node(13, "ProfilerStep#6", pb.COMP_NODE, 2050, 300, (attr("is_cpu_op", bool_val=False),)),  # device mark
    ])


def test_timed_trace_steps_compute_and_collectives(tmp_path: Path) -> None:
    w = read_chakra(timed_trace(tmp_path / "timed.et"))
    assert w.timed and w.world_size == 4 and w.steps == 2
    s5, s6 = w.ranks[0].steps
    # step 5 runs from its marker (1000) to step 6's (2000); times relative to 1000
    assert (s5.number, s5.duration_us) == (5, 1000.0)
    assert s5.compute == ((100.0, 400.0), (950.0, 1000.0))
    assert [(c.kind, c.size_bytes, c.group_ranks, c.start_us, c.duration_us) for c in s5.collectives] == [
        ("all_gather", 2048, (0, 1), 450.0, 50.0),
        ("all_reduce", 4096, (0, 1, 2, 3), 500.0, 300.0),
    ]
    assert (s5.collectives[1].stream, s5.collectives[1].dtype) == ("20", "bfloat16")
    assert s5.collectives[0].dtype == "unknown"
    # the last step ends at the later of its marker's end (2500) and its last event's end (2300 + 400)
    assert (s6.number, s6.duration_us) == (6, 700.0)
    assert s6.compute == ((0.0, 50.0), (100.0, 200.0))  # the kernel from step 5 spills into step 6
    assert [(c.kind, c.start_us, c.group_ranks) for c in s6.collectives] == [("reduce_scatter", 300.0, (0, 1, 2, 3))]
    assert any("taken as rank 0 of 4" in n for n in w.notes)


def test_timed_trace_without_markers_is_one_step(tmp_path: Path) -> None:
    p = write(tmp_path / "one.et", [META, kernel(1, 5000, 100), coll(2, pb.BROADCAST, 64, 5200, 10),
                                    coll(3, pb.BARRIER, 0, 5050, 5)])
    w = read_chakra(p, world_size=2)
    (step,) = w.ranks[0].steps
    assert (step.number, step.duration_us, step.compute) == (0, 210.0, ((0.0, 100.0),))
    assert [(c.kind, c.start_us, c.group_ranks) for c in step.collectives] == [
        ("barrier", 50.0, (0, 1)), ("broadcast", 200.0, (0, 1))]


def test_process_groups_the_trace_does_not_list(tmp_path: Path) -> None:
    p = write(tmp_path / "pgs.et", [META, coll(1, pb.ALL_REDUCE, 64, 0, 0, attr("pg_name", string_val="3")),
                                    coll(2, pb.ALL_REDUCE, 64, 0, 0, attr("pg_name", string_val="5"))])
    with pytest.raises(TraceError, match=r"process groups \['3', '5'\] whose ranks the trace does not list"):
        read_chakra(p)
    with pytest.raises(TraceError, match="world_size 8 given, but the trace says 4"):
        read_chakra(timed_trace(tmp_path / "timed.et"), world_size=8)


#: Run in a fresh interpreter: reads a Chakra file in 64 KiB chunks and prints the most memory the reader's own
#: lines (frames in traffic/traces/) held at once. Garbage collection is off, so its timing moves nothing, and no
#: other thread of a test runner allocates in the process. Sampled every 256 messages and at the end.
_MEASURE_READER = """
import gc, sys, tracemalloc
from traffic.traces import chakra
chakra._CHUNK_BYTES = 1 << 16
own = [tracemalloc.Filter(True, chakra.__file__.rsplit("/", 1)[0] + "/*")]
peak = 0
def sample():
    global peak
    snap = tracemalloc.take_snapshot().filter_traces(own)
    peak = max(peak, sum(t.size for t in snap.traces))
frames = chakra._frames
def sampled(*args):
    for i, item in enumerate(frames(*args)):
        if i % 256 == 0:
            sample()
        yield item
chakra._frames = sampled
gc.collect()
gc.disable()
tracemalloc.start()
w = chakra.read_chakra(chakra.Path(sys.argv[1]))
sample()
print(peak, w.ranks[0].steps[0].compute)
"""


def test_memory_grows_with_collectives_not_nodes(tmp_path: Path) -> None:
    def trace(n_nodes: int) -> Path:
        msgs = [META] + [kernel(i, 1000 + 10 * i, 10) for i in range(n_nodes)]
        return write(tmp_path / f"big{n_nodes}.et", msgs + [coll(n_nodes, pb.ALL_REDUCE, 1 << 20, 1000, 5)])

    peaks = []
    for n in (10_000, 40_000):
        p = trace(n)
        res = subprocess.run([sys.executable, "-c", _MEASURE_READER, str(p)], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        peak, compute = res.stdout.split(" ", 1)
        assert compute.strip() == repr(((0.0, 10.0 * n),))  # back-to-back kernels merge into one
        peaks.append(int(peak))
    print("reader peaks (bytes):", peaks)
    size_bytes = p.stat().st_size
    assert size_bytes > 1 << 20
    assert 0 < peaks[0] and peaks[1] < 1.25 * peaks[0] and peaks[1] < size_bytes / 2, (peaks, size_bytes)  # 4x nodes


# --- the generated code -------------------------------------------------------------------------------------

def test_generated_code_is_regenerated_from_the_proto(tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is needed to run scripts/gen_proto.sh")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert res.returncode == 0, res.stdout + res.stderr
    for name in ("chakra_et_pb2.py", "chakra_et_pb2.pyi"):
        fresh = (tmp_path / "traffic" / "traces" / name).read_bytes()
        assert fresh == (ROOT / "traffic" / "traces" / name).read_bytes(), f"{name} is stale: run scripts/gen_proto.sh"


def test_schema_field_numbers_are_chakras() -> None:
    # From mlcommons/chakra schema/protobuf/et_def.proto (read there, not from our .proto)
    node = {f.name: (f.number, f.type) for f in pb.Node.DESCRIPTOR.fields}
    d = pb.Node.DESCRIPTOR.fields[0]
    assert node == {"id": (1, d.TYPE_UINT64), "name": (2, d.TYPE_STRING), "type": (3, d.TYPE_ENUM),
                    "ctrl_deps": (4, d.TYPE_UINT64), "data_deps": (5, d.TYPE_UINT64),
                    "start_time_micros": (6, d.TYPE_UINT64), "duration_micros": (7, d.TYPE_UINT64),
                    "inputs": (8, d.TYPE_MESSAGE), "outputs": (9, d.TYPE_MESSAGE), "attr": (10, d.TYPE_MESSAGE)}
    meta = {f.name: f.number for f in pb.GlobalMetadata.DESCRIPTOR.fields}
    assert meta == {"version": 1, "attr": 2}
    value = {f.name: f.number for f in pb.AttributeProto.DESCRIPTOR.oneofs_by_name["value"].fields}
    assert (value["int64_val"], value["uint64_val"], value["bool_val"], value["string_val"], value["bytes_list"]) \
        == (9, 13, 27, 29, 32) and len(value) == 30
    assert (pb.COMP_NODE, pb.COMM_COLL_NODE, pb.ALL_REDUCE, pb.REDUCE_SCATTER_BLOCK, pb.BARRIER) == (4, 7, 0, 8, 9)
