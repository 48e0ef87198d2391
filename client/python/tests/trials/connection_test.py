"""create_trial reaches collectors as they are set up (plaintext, bearer
tokens, TLS, mutual TLS) and says clearly what went wrong: an unknown job,
an unreachable collector, a refused token (the collector's words passed
through), inconsistent arguments.

Certificates are made at test time by /usr/bin/openssl, like
//tests:security_test's: a throwaway CA, a server certificate for 127.0.0.1
and localhost, a client certificate from the CA.
"""

import hashlib
import json
import subprocess

import grpc
import numpy as np
import pytest

from raw_ingest import Worker
from sonde.trials import (
    CollectorUnavailable,
    JobNotFound,
    QueryError,
    create_trial,
)

TOKEN = "s3cret-analyst-token"


def test_an_unknown_job_is_named(collector):
    with pytest.raises(JobNotFound) as e:
        create_trial(collector.address, "no-such-job")
    assert e.value.job == "no-such-job" and e.value.code == grpc.StatusCode.NOT_FOUND
    assert "no job 'no-such-job'" in str(e.value) and collector.address in str(e.value)
    assert isinstance(e.value, LookupError)


def test_an_unreachable_collector_says_where(start_collector):
    stopped = start_collector()
    address = stopped.address
    stopped.stop()
    with pytest.raises(CollectorUnavailable) as e:
        create_trial(address, "job", timeout=10)
    assert "cannot reach the Sonde collector at " + address in str(e.value)
    assert isinstance(e.value, ConnectionError)


def test_inconsistent_security_arguments_are_refused(collector):
    with pytest.raises(ValueError, match="both certificate_chain and private_key"):
        create_trial(collector.address, "j", certificate_chain=b"x")
    with pytest.raises(ValueError, match="only used with TLS"):
        create_trial(collector.address, "j", certificate_chain=b"x", private_key=b"y")
    with pytest.raises(ValueError, match="line break"):
        create_trial(collector.address, "j", token="a\nb")
    with pytest.raises(ValueError, match="cannot read the CA certificate file '/nonexistent.pem'"):
        create_trial(collector.address, "j", root_certificates="/nonexistent.pem")


@pytest.fixture
def token_collector(start_collector, tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"name": "analyst", "sha256": hashlib.sha256(TOKEN.encode()).hexdigest(),
         "project": "*", "rights": ["read", "write"]},
        {"name": "other", "sha256": hashlib.sha256(b"other-token").hexdigest(),
         "jobs": ["elsewhere"], "rights": ["read"]},
    ]}))
    c = start_collector(args=["--auth_tokens=" + str(tokens)])
    w = Worker(c.address, "guarded", token=TOKEN)
    w.step(0, {"loss": np.array(0.5)})
    w.end_job()
    return c


def test_a_token_opens_a_guarded_collector(token_collector, open_trial, monkeypatch):
    monkeypatch.delenv("SONDE_TOKEN", raising=False)
    with pytest.raises(QueryError) as e:
        create_trial(token_collector.address, "guarded")
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "GetJob of job 'guarded'" in str(e.value) and e.value.details in str(e.value)
    with pytest.raises(QueryError) as e:
        create_trial(token_collector.address, "guarded", token="other-token")
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert e.value.details == "token 'other' has no read right on job 'guarded'"
    trial = open_trial(token_collector.address, "guarded", token=TOKEN)
    assert trial.steps() == [0] and trial.tensor("loss").value(0) == 0.5
    trial.wait_for_steps([0])  # the WatchSteps stream carries the token too
    monkeypatch.setenv("SONDE_TOKEN", TOKEN)
    assert open_trial(token_collector.address, "guarded").steps() == [0]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    (d / "ca.cnf").write_text(
        "[req]\ndistinguished_name = dn\nprompt = no\nx509_extensions = v3_ca\n"
        "[dn]\nCN = Sonde test CA\n[v3_ca]\nbasicConstraints = critical,CA:TRUE\n"
        "keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n")
    (d / "leaf.cnf").write_text("[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = sonde\n")
    (d / "server.ext").write_text(
        "subjectAltName = IP:127.0.0.1,DNS:localhost\nbasicConstraints = CA:FALSE\n"
        "keyUsage = digitalSignature,keyEncipherment\nextendedKeyUsage = serverAuth\n")
    (d / "client.ext").write_text(
        "basicConstraints = CA:FALSE\nkeyUsage = digitalSignature\nextendedKeyUsage = clientAuth\n")
    key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    script = ["set -e", "openssl req -x509 -config ca.cnf {} -keyout ca.key -out ca.pem -days 2"
              .format(key)]
    for leaf in ("server", "client"):
        script.append("openssl req -new -config leaf.cnf {k} -keyout {l}.key -out {l}.csr && "
                      "openssl x509 -req -in {l}.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
                      "-days 2 -extfile {l}.ext -out {l}.pem".format(k=key, l=leaf))
    subprocess.run(" && ".join(script), shell=True, cwd=d, check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin"})
    return d


def test_tls_with_the_ca_to_trust(start_collector, certificates, open_trial):
    c = start_collector(args=["--tls_cert=%s" % (certificates / "server.pem"),
                              "--tls_key=%s" % (certificates / "server.key")])
    # The job does not exist: the answer proves the call went through TLS.
    with pytest.raises(JobNotFound):
        create_trial(c.address, "j", root_certificates=certificates / "ca.pem")
    with pytest.raises(JobNotFound):
        create_trial(c.address, "j", root_certificates=(certificates / "ca.pem").read_bytes(),
                     server_name="localhost")
    with pytest.raises(CollectorUnavailable):  # plaintext against a TLS collector
        create_trial(c.address, "j", timeout=10)


def test_mutual_tls_needs_the_client_certificate(start_collector, certificates):
    c = start_collector(args=["--tls_cert=%s" % (certificates / "server.pem"),
                              "--tls_key=%s" % (certificates / "server.key"),
                              "--tls_client_ca=%s" % (certificates / "ca.pem")])
    with pytest.raises(JobNotFound):
        create_trial(c.address, "j", root_certificates=certificates / "ca.pem",
                     certificate_chain=certificates / "client.pem",
                     private_key=str(certificates / "client.key"))
    with pytest.raises(CollectorUnavailable):
        create_trial(c.address, "j", root_certificates=certificates / "ca.pem", timeout=10)
