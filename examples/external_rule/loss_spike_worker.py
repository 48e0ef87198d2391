#!/usr/bin/python3
"""An external rule worker for Sonde, in Python.

It follows a job's completed steps through the collector's Query service
(WatchSteps), judges them, and posts its verdict back (PostRuleResult), where
it appears beside the built-in rules (`sonde rules --job ...`).

LossSpike: after `--warmup` losses, a loss more than `--factor` times the
lowest loss seen so far is an issue; with --stop it asks the collector to
stop the job's training.

Run with Debian's interpreter (python3-grpcio) and the sonde package's stubs
(sonde.v1, built by `bazel build //client/python:sonde`) on the path:
PYTHONPATH=client/python:bazel-bin/client/python /usr/bin/python3 \
    examples/external_rule/loss_spike_worker.py --collector 127.0.0.1:7070 --job my-job
"""
import argparse
import os
import sys

import grpc

# Only the stubs and grpc: no native extension in this process.
os.environ.setdefault("SONDE_NO_EXTENSION", "1")
from sonde.v1 import query_pb2, query_pb2_grpc, rule_pb2  # noqa: E402


def post(stub, args, status, step, message, observed=0.0, threshold=0.0, tensor=""):
    result = rule_pb2.RuleResult(
        job=args.job, rule=args.rule, rule_type="LossSpike (external)", status=status,
        step=step, message=message, observed=observed, threshold=threshold,
        suggestion="Lower the learning rate or clip gradients; look for bad batches.")
    if tensor:
        result.tensors.append(tensor)
    actions = ["StopTraining", "Log"] if args.stop else ["Log"]
    stub.PostRuleResult(query_pb2.PostRuleResultRequest(result=result, actions=actions))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collector", default="127.0.0.1:7070")
    parser.add_argument("--job", required=True)
    parser.add_argument("--rule", default="LossSpike")
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--stop", action="store_true")
    args = parser.parse_args()

    stub = query_pb2_grpc.QueryStub(grpc.insecure_channel(args.collector))
    post(stub, args, rule_pb2.RULE_STATUS_IN_PROGRESS, -1, "watching the job's losses")
    best = None
    seen = 0
    last = -1
    for step in stub.WatchSteps(query_pb2.WatchStepsRequest(job=args.job)):
        last = step.step
        for tensor in step.tensors:
            if "losses" not in tensor.collections:
                continue
            loss = tensor.statistics.mean
            seen += 1
            if best is not None and seen > args.warmup and loss > args.factor * best:
                message = (f"loss '{tensor.tensor_name}' jumped to {loss:g} at step {step.step}, "
                           f"{loss / best:.3g} times its lowest value {best:g}")
                post(stub, args, rule_pb2.RULE_STATUS_ISSUES_FOUND, step.step, message,
                     observed=loss / best, threshold=args.factor, tensor=tensor.tensor_name)
                print(message)
                return 0
            best = loss if best is None else min(best, loss)
    post(stub, args, rule_pb2.RULE_STATUS_NO_ISSUES_FOUND, last,
         f"no loss spike in {seen} losses")
    print(f"no loss spike in {seen} losses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
