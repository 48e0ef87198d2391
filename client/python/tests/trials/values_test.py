"""sonde.trials reads back exactly what a finished job stored: steps per mode,
tensor names, values of every dtype bit for bit, workers, statistics-only
tensors and their reductions, and smdebug's exceptions for what is missing.

One job, written once for the module through the raw ingest stream by two
workers: TRAIN steps 0-2 at global steps 0-2, EVAL steps 0-1 at global 3-4,
global step 5 skipped, TRAIN step 3 at global 6.
"""

import math

import grpc
import numpy as np
import pytest

from raw_ingest import Worker, bf16_bytes, statistics_of
from sonde.modes import ModeKeys
from sonde.trials import (
    InvalidWorker,
    NoMoreData,
    QueryError,
    StepState,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
    create_trial,
)
from sonde.trials.reductions import FROM_STATISTICS, REDUCTIONS
from sonde.v1 import query_pb2, query_pb2_grpc, tensor_pb2
from sonde_pytest import Collector

TRAIN, EVAL, PREDICT, GLOBAL = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL
JOB = "values-job"
# (global step, mode, mode step)
STEPS = [(0, TRAIN, 0), (1, TRAIN, 1), (2, TRAIN, 2), (3, EVAL, 0), (4, EVAL, 1), (6, TRAIN, 3)]


def weight(step, worker):
    w = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5) * (step + 1) + 100 * worker
    if step == 1:
        w[0, 0], w[0, 1], w[0, 2], w[0, 3] = np.nan, np.inf, -np.inf, -0.0
        w[1, 0] = np.float32(1e-45)  # the smallest subnormal
    return w


def loss(step, worker):
    return np.array(1.0 / (step + 1) + worker, dtype=np.float64)


def grad(step, worker):
    g = np.linspace(-1, 2, 24, dtype=np.float32).reshape(4, 6) * (step + 1) + worker
    if step == 2:
        g[3, 5] = np.nan
    if step == 6:
        g[0, 0] = np.inf
    return g


BF16 = np.array([[1.5, -0.0], [np.inf, 3.0e38]], dtype=np.float32)
ZOO = {
    "zoo/f16": np.array([0.5, -0.0, np.inf, -65504, 6e-8], dtype=np.float16),
    "zoo/i8": np.array([-128, -1, 0, 127], dtype=np.int8),
    "zoo/i16": np.array([[-32768, 1], [2, 32767]], dtype=np.int16),
    "zoo/i32": np.array([-2**31, 0, 2**31 - 1], dtype=np.int32),
    "zoo/i64": np.array([[-2**63, 1, 2], [3, 4, 2**63 - 1]], dtype=np.int64),
    "zoo/u8": np.array([0, 1, 254, 255], dtype=np.uint8),
    "zoo/bool": np.array([True, False, True], dtype=np.bool_),
    "zoo/f64": np.array([math.pi, -0.0, np.nan, 5e-324], dtype=np.float64),
    "zoo/empty": np.zeros((0, 3), dtype=np.float32),
    "zoo/scalar": np.array(7.25, dtype=np.float32),
}
BIG = np.arange(300_000, dtype=np.float32) * np.float32(0.5) - 7  # 1.2 MB: several pieces


def write_job(address):
    workers = [Worker(address, JOB, worker=w, world_size=2) for w in (0, 1)]
    for w in workers:
        for step, mode, mode_step in STEPS:
            def send(name, array, collections):
                w.tensor(step, name, array, mode=mode, mode_step=mode_step,
                         collections=collections)
            send("loss", loss(step, w.worker), ["losses"])
            w.summary(step, "grad/summary", grad(step, w.worker), mode=mode, mode_step=mode_step,
                      collections=["gradients"])
            if mode == TRAIN:
                send("fc1.weight", weight(step, w.worker), ["weights", "default"])
            else:
                send("eval/acc", np.array([0.5 + step], dtype=np.float32), ["metrics"])
            if step == 0 and w.worker == 0:
                for name, array in ZOO.items():
                    send(name, array, ["zoo"])
                w.tensor(step, "zoo/bf16", BF16, mode=mode, mode_step=mode_step,
                         collections=["zoo"], dtype=tensor_pb2.DTYPE_BF16,
                         payload=bf16_bytes(BF16))
                send("big", BIG, [])
            w.end_step(step, mode=mode, mode_step=mode_step)
    for w in workers:
        w.end_job()


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    collector = Collector(tmp_path_factory.mktemp("db"))
    try:
        write_job(collector.address)
        with create_trial(collector.address, JOB) as t:
            yield t
    finally:
        collector.stop()


def same_bits(actual, expected):
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes()


def test_steps_are_global_steps_or_mode_steps(trial):
    assert trial.steps() == [0, 1, 2, 3, 4, 6]
    assert trial.steps(mode=GLOBAL) == [0, 1, 2, 3, 4, 6]
    assert trial.steps(mode=TRAIN) == [0, 1, 2, 3]
    assert trial.steps(mode=EVAL) == [0, 1]
    assert trial.steps(mode=PREDICT) == []
    assert trial.modes() == [TRAIN, EVAL]


def test_global_and_mode_steps_convert(trial):
    assert trial.global_step(EVAL, 1) == 4
    assert trial.global_step(TRAIN, 3) == 6
    assert trial.global_step(TRAIN, 4) is None
    assert trial.mode(6) == TRAIN
    assert trial.mode_step(6) == 3
    assert trial.mode_modestep(3) == (EVAL, 0)
    assert trial.mode_modestep(5) == (None, None)


def test_the_job_has_ended(trial):
    assert trial.training_ended()
    assert trial.loaded_all_steps
    assert trial.job_status() == "Finished"
    assert trial.last_complete_step == 6
    assert trial.workers() == [0, 1]


def test_tensor_names_filter_by_regex_collection_step_and_mode(trial):
    everything = trial.tensor_names()
    assert everything == sorted(["loss", "grad/summary", "fc1.weight", "eval/acc", "big",
                                 "zoo/bf16"] + list(ZOO))
    assert trial.tensor_names(regex="^zoo/i") == ["zoo/i16", "zoo/i32", "zoo/i64", "zoo/i8"]
    assert trial.tensor_names(regex=["acc$", r"\.weight"]) == ["eval/acc", "fc1.weight"]
    assert trial.tensor_names(collection="weights") == ["fc1.weight"]
    assert trial.tensor_names(collection=trial.collection("losses")) == ["loss"]
    assert trial.tensor_names(step=3) == ["eval/acc", "grad/summary", "loss"]
    assert trial.tensor_names(mode=EVAL) == ["eval/acc", "grad/summary", "loss"]
    assert trial.tensor_names(step=1, mode=EVAL) == ["eval/acc", "grad/summary", "loss"]
    assert trial.tensor_names(step=1, mode=TRAIN) == ["fc1.weight", "grad/summary", "loss"]
    assert trial.tensor_names(step=0, mode=TRAIN, regex="bf16|big") == ["big", "zoo/bf16"]
    assert trial.tensor_names(step=5) == []
    assert trial.tensor_names(collection="nope") == []


def test_collections_name_their_tensors(trial):
    collections = trial.collections()
    assert sorted(collections) == ["default", "gradients", "losses", "metrics", "weights", "zoo"]
    assert collections["zoo"].tensor_names == set(ZOO) | {"zoo/bf16"}
    assert collections["default"].tensor_names == {"fc1.weight"}
    assert trial.collection("gradients").name == "gradients"
    with pytest.raises(KeyError, match="nope"):
        trial.collection("nope")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_dtype_reads_back_bit_for_bit(trial, name):
    same_bits(trial.tensor(name).value(0), ZOO[name])
    same_bits(trial.tensor(name).value(0, mode=TRAIN), ZOO[name])


def test_bfloat16_reads_back_as_exact_float32(trial):
    value = trial.tensor("zoo/bf16").value(0)
    expected = (np.frombuffer(bf16_bytes(BF16), "<u2").astype(np.uint32) << 16).view(np.float32)
    same_bits(value, expected.reshape(2, 2))
    assert value[0, 0] == 1.5 and np.signbit(value[0, 1]) and value[1, 0] == np.inf


def test_nan_infinities_negative_zero_and_subnormals_keep_their_bits(trial):
    value = trial.tensor("fc1.weight").value(1, mode=TRAIN)
    same_bits(value, weight(1, 0))
    assert np.isnan(value[0, 0]) and value[0, 1] == np.inf and value[0, 2] == -np.inf
    assert np.signbit(value[0, 3]) and value[1, 0] == np.float32(1e-45)


def test_a_tensor_of_several_pieces_reads_back_whole(trial):
    with grpc.insecure_channel(trial._conn.address) as channel:
        chunks = list(query_pb2_grpc.QueryStub(channel).ReadTensor(
            query_pb2.ReadTensorRequest(job=JOB, tensor="big", step=0), timeout=30))
    assert len(chunks) == 2  # the collector stores values in pieces of 1 MiB
    same_bits(trial.tensor("big").value(0), BIG)


def test_values_are_writable_arrays(trial):
    value = trial.tensor("fc1.weight").value(0)
    value[0, 0] = 1  # smdebug hands out ordinary arrays
    assert trial.tensor("fc1.weight").value(0)[0, 0] == weight(0, 0)[0, 0]


def test_a_mode_step_and_its_global_step_read_the_same_values(trial):
    same_bits(trial.tensor("loss").value(4), loss(4, 0))
    same_bits(trial.tensor("loss").value(1, mode=EVAL), loss(4, 0))
    same_bits(trial.tensor("fc1.weight").value(3, mode=TRAIN), weight(6, 0))


def test_workers_are_ranks_and_the_lowest_answers_by_default(trial):
    t = trial.tensor("fc1.weight")
    assert t.workers(2) == [0, 1]
    assert t.workers(2, mode=TRAIN) == [0, 1]
    assert trial.tensor("zoo/u8").workers(0) == [0]
    same_bits(t.value(2), weight(2, 0))
    same_bits(t.value(2, worker=1), weight(2, 1))
    same_bits(t.value(2, worker="worker_1"), weight(2, 1))
    with pytest.raises(InvalidWorker):
        t.value(2, worker=7)
    with pytest.raises(InvalidWorker):
        trial.tensor("zoo/u8").value(0, worker=1)
    with pytest.raises(TensorUnavailableForStep):
        t.workers(3)


def test_values_maps_every_step_of_a_mode(trial):
    t = trial.tensor("loss")
    values = t.values(mode=EVAL)
    assert sorted(values) == [0, 1]
    same_bits(values[1], loss(4, 0))
    assert sorted(t.values()) == [0, 1, 2, 3, 4, 6]
    same_bits(t.values(worker=1)[6], loss(6, 1))


def test_tensor_steps_and_prev_steps(trial):
    assert trial.tensor("eval/acc").steps() == [3, 4]
    assert trial.tensor("eval/acc").steps(mode=EVAL) == [0, 1]
    assert trial.tensor("eval/acc").steps(mode=TRAIN) == []
    assert trial.tensor("zoo/i8").steps() == [0]
    assert trial.tensor("fc1.weight").steps(mode=TRAIN) == [0, 1, 2, 3]
    assert trial.tensor("loss").prev_steps(4, 2) == [3, 4]
    assert trial.tensor("loss").prev_steps(5) == [0, 1, 2, 3, 4]
    assert trial.tensor("loss").prev_steps(2, 2, mode=TRAIN) == [1, 2]


def test_what_was_never_saved_raises_smdebugs_exceptions(trial):
    with pytest.raises(TensorUnavailable) as e:
        trial.tensor("nope")
    assert e.value.tname == "nope"
    assert not trial.has_tensor("nope") and trial.has_tensor("loss")
    # Step 3 exists (EVAL), the weight was not saved there, and never will be.
    with pytest.raises(TensorUnavailableForStep) as e:
        trial.tensor("fc1.weight").value(3)
    assert (e.value.tname, e.value.step, e.value.mode, e.value.has_reductions) == \
        ("fc1.weight", 3, GLOBAL, False)
    with pytest.raises(StepUnavailable) as e:
        trial.tensor("loss").value(5)
    assert (e.value.step, e.value.mode) == (5, GLOBAL)
    with pytest.raises(StepUnavailable):
        trial.tensor("loss").value(2, mode=EVAL)
    with pytest.raises(ValueError):
        trial.tensor("loss").value(-1)


def test_step_states_and_waits_after_the_end(trial):
    assert trial.has_passed_step(4) == StepState.AVAILABLE
    assert trial.has_passed_step(5) == StepState.UNAVAILABLE
    assert trial.has_passed_step(100) == StepState.UNAVAILABLE
    assert trial.has_passed_step(1, mode=EVAL) == StepState.AVAILABLE
    assert trial.has_passed_step(2, mode=EVAL) == StepState.UNAVAILABLE
    trial.wait_for_steps([0, 6])
    trial.wait_for_steps([3], mode=TRAIN)
    with pytest.raises(StepUnavailable):
        trial.wait_for_steps([4, 5])
    with pytest.raises(NoMoreData) as e:
        trial.wait_for_steps([100])
    assert (e.value.step, e.value.mode, e.value.last_step) == (100, GLOBAL, 6)
    with pytest.raises(NoMoreData) as e:
        trial.wait_for_steps([4], mode=TRAIN)
    assert (e.value.step, e.value.mode, e.value.last_step) == (4, TRAIN, 3)


def expected_from_statistics(name, stats, abs_):
    """What the statistics say, by proto/tensor.proto's definitions, for a
    tensor with neither NaN nor Inf."""
    n = stats.count
    if abs_:
        table = {"min": stats.abs_min, "max": stats.abs_max, "mean": stats.l1 / n,
                 "sum": stats.l1, "l1": stats.l1, "l2": math.sqrt(stats.sum_squares)}
        if stats.min >= 0 or stats.max <= 0:
            table["variance"] = stats.m2 / n
        else:
            table["variance"] = stats.sum_squares / n - (stats.l1 / n) ** 2
    else:
        table = {"min": stats.min, "max": stats.max, "mean": stats.sum / n, "sum": stats.sum,
                 "l1": stats.l1, "l2": math.sqrt(stats.sum_squares), "variance": stats.m2 / n}
    table["std"] = math.sqrt(table["variance"])
    return table[name]


@pytest.mark.parametrize("abs_", [False, True])
@pytest.mark.parametrize("name", FROM_STATISTICS)
def test_a_statistics_only_tensor_answers_reductions_from_its_statistics(trial, name, abs_):
    t = trial.tensor("grad/summary")
    for step, worker in [(1, None), (1, 1), (4, 0)]:
        data = grad(step, worker or 0)
        got = t.reduction_value(step, name, worker=worker, abs=abs_)
        assert isinstance(got, np.float64)
        assert got == expected_from_statistics(name, statistics_of(data), abs_)
        numpy_says = getattr(np, {"variance": "var", "l1": "sum", "l2": "sum"}.get(name, name))
        x = np.abs(data.astype(np.float64)) if abs_ or name == "l1" else data.astype(np.float64)
        if name == "l2":
            expected = math.sqrt(np.sum(x * x))
        elif name in ("min", "max"):
            expected = getattr(np, "a" + name)(x)
        else:
            expected = numpy_says(x)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    # Through a mode step as well: TRAIN step 1 is global step 1.
    assert t.reduction_value(1, name, mode=TRAIN, abs=abs_) == t.reduction_value(1, name, abs=abs_)


def test_a_statistics_only_tensor_has_no_values_and_no_product(trial):
    t = trial.tensor("grad/summary")
    with pytest.raises(TensorUnavailableForStep) as e:
        t.value(1)
    assert e.value.has_reductions and e.value.tname == "grad/summary"
    with pytest.raises(TensorUnavailableForStep) as e:
        t.reduction_value(1, "prod")
    assert e.value.has_reductions
    with pytest.raises(ValueError, match="median"):
        t.reduction_value(1, "median")
    assert set(t.reduction_values(1)) == {(n, a) for n in FROM_STATISTICS for a in (False, True)}
    assert t.reduction_values(1, worker=1)[("max", False)] == np.max(grad(1, 1))


def test_nan_and_infinity_in_statistics_propagate_as_numpy_would(trial):
    t = trial.tensor("grad/summary")
    for name in FROM_STATISTICS:  # step 2 holds a NaN
        assert math.isnan(t.reduction_value(2, name))
        assert math.isnan(t.reduction_value(2, name, abs=True))
    # Step 6 holds +Inf (the first element).
    assert t.reduction_value(6, "max") == np.inf
    assert t.reduction_value(6, "min") == np.min(grad(6, 0))
    assert t.reduction_value(6, "mean") == np.inf and t.reduction_value(6, "sum") == np.inf
    assert t.reduction_value(6, "l1") == np.inf and t.reduction_value(6, "l2") == np.inf
    assert math.isnan(t.reduction_value(6, "variance")) and math.isnan(t.reduction_value(6, "std"))


@pytest.mark.parametrize("abs_", [False, True])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_of_saved_values_are_numpys(trial, name, abs_):
    t = trial.tensor("fc1.weight")
    data = np.absolute(weight(2, 1)) if abs_ else weight(2, 1)
    if name in ("l1", "l2"):
        expected = np.linalg.norm(data.ravel(), ord=int(name[1]))
    else:
        expected = getattr(np, {"min": "amin", "max": "amax", "variance": "var"}.get(name, name))(
            data)
    got = t.reduction_value(2, name, worker=1, abs=abs_)
    assert type(got) is type(expected) and got == expected
    got = t.reduction_value(2, name, mode=TRAIN, worker="worker_1", abs=abs_)
    assert got == expected


def test_reductions_of_values_with_nan_are_nan(trial):
    t = trial.tensor("fc1.weight")
    assert math.isnan(t.reduction_value(1, "mean"))
    assert math.isnan(t.reduction_value(1, "max", abs=True))


def test_the_older_smdebug_names_read_the_same(trial):
    """trial.tensors() and tensor.step(s).value, as the seed blog's
    notebook reads them."""
    assert trial.tensors() == trial.tensor_names()
    assert trial.tensors(collection="weights") == ["fc1.weight"]
    t = trial.tensor("fc1.weight")
    for s in t.steps():
        same_bits(t.step(s).value, t.value(s))
    at = t.step(3, mode=TRAIN, worker=1)
    same_bits(at.value, weight(6, 1))
    assert at.reduction_value("max") == t.reduction_value(3, "max", mode=TRAIN, worker=1)
    assert at.reduction_values() == t.reduction_values(3, mode=TRAIN, worker=1)
    with pytest.raises(StepUnavailable):
        t.step(5).value  # noqa: B018 (global step 5 saved nothing)


def test_long_answers_are_read_in_pages(trial, monkeypatch):
    # One step or point per page: what a job past one message's size gets
    # (pages end between steps, every worker's point of a step together).
    from sonde.trials import tensor as tensor_module
    from sonde.trials import trial as trial_module
    modes = (GLOBAL, TRAIN, EVAL)
    steps = {m: trial.steps(mode=m) for m in modes}
    loss_steps = {m: trial.tensor("loss").steps(mode=m) for m in modes}
    means = {(s, w): trial.tensor("loss").reduction_value(s, "mean", worker=w)
             for s in steps[GLOBAL] for w in (0, 1)}
    monkeypatch.setattr(trial_module, "PAGE_SIZE", 1)
    monkeypatch.setattr(tensor_module, "PAGE_SIZE", 1)
    names = trial.tensor_names()
    assert len(names) > 1
    with create_trial(trial._conn.address, JOB) as paged:
        assert paged.tensor_names() == names
        assert {m: paged.steps(mode=m) for m in modes} == steps
        t = paged.tensor("loss")
        assert {m: t.steps(mode=m) for m in modes} == loss_steps
        assert {(s, w): t.reduction_value(s, "mean", worker=w)
                for s in steps[GLOBAL] for w in (0, 1)} == means
        assert sorted(t.values()) == steps[GLOBAL]
        same_bits(t.values(worker=1)[6], loss(6, 1))


def test_a_page_cut_without_progress_is_an_error(trial, monkeypatch):
    # A collector (or a proxy) that says a page was cut but sends nothing
    # past where it started: asking again would loop, stopping would pass a
    # short list off as whole.
    with create_trial(trial._conn.address, JOB) as stalled:
        real = stalled._conn.call

        def stalling(method, request, **kwargs):
            response = real(method, request, **kwargs)
            if method == "ListSteps":
                del response.steps[:]
                response.truncated = True
            elif method == "ReadSeries":
                del response.points[:]
                response.truncated = True
            return response

        loss = stalled.tensor("loss")
        monkeypatch.setattr(stalled._conn, "call", stalling)
        with pytest.raises(QueryError, match="cut its answer of steps of job 'values-job'"):
            stalled.steps()
        with pytest.raises(QueryError, match="series points .* without going past it"):
            loss.steps()
