"""The generated stubs import as sonde.v1 and reach a real collector."""

import grpc

from sonde.v1 import query_pb2, query_pb2_grpc, tensor_pb2


def test_enums_match_smdebug_mode_numbers():
    assert tensor_pb2.MODE_TRAIN == 1
    assert tensor_pb2.MODE_EVAL == 2
    assert tensor_pb2.MODE_PREDICT == 3
    assert tensor_pb2.MODE_GLOBAL == 4


def test_list_jobs_on_a_fresh_collector(collector):
    with grpc.insecure_channel(collector.address) as channel:
        stub = query_pb2_grpc.QueryStub(channel)
        jobs = stub.ListJobs(query_pb2.ListJobsRequest(), timeout=10)
        assert list(jobs.jobs) == []
        try:
            stub.GetJob(query_pb2.GetJobRequest(job="nope"), timeout=10)
            raise AssertionError("GetJob of an unknown job succeeded")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND
            assert "nope" in e.details()
