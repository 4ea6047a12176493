"""Security: TLS (server and client certificates), the shared token, non-loopback binds,
file permissions, and no code-executing deserialisation anywhere on a wire.

Certificates are made per module with the ``cryptography`` package when it is
importable, else with the ``openssl`` command line (one of them must be there). Every
server here binds a loopback address only.
"""
from __future__ import annotations

import ast
import datetime
import json
import os
import re
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlinkd.client_lib import connect
from rlinkd.client_lib.transport import RLlinkClient, ServerError
from rlinkd.daemon.config import load_config
from rlinkd.daemon.errors import ConfigError, ExitCode
from tests.helpers import REPO, peer_closed, raw_connect, raw_recv, raw_send, wait_for

pytestmark = pytest.mark.process

TOKEN = "s3cret"


# ---------------------------------------------------------------- a throwaway PKI
def make_pki(out: Path) -> dict[str, Path]:
    """CA, server (CN/SAN 127.0.0.1), client, and a client of an unrelated CA: PEM files."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            raise AssertionError("TLS tests need the `cryptography` package or the `openssl` "
                                 "command; neither is available") from None
        return _pki_openssl(out)
    return _pki_cryptography(out)


def _pki_cryptography(out: Path) -> dict[str, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)
    files: dict[str, Path] = {}

    def write_key(name: str, key) -> None:
        files[f"{name}_key"] = out / f"{name}.key"
        files[f"{name}_key"].write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))

    def write_cert(name: str, cert) -> None:
        files[name] = out / f"{name}.pem"
        files[name].write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def build(subject: str, key, issuer_name, issuer_key, *, ca: bool, issuer_ski=None,
              san=None, usage=None):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer_name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                                  critical=False))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        else:
            builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                issuer_key.public_key()), critical=False)
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(san))]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    cas = {}
    for ca_name in ("ca", "other_ca"):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rlinkd test {ca_name}")])
        cert = build(f"rlinkd test {ca_name}", key, name, key, ca=True)
        write_key(ca_name, key)
        write_cert(ca_name, cert)
        cas[ca_name] = (name, key)
    for leaf, ca_name, san, usage in (
            ("server", "ca", "127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH),
            ("client", "ca", None, ExtendedKeyUsageOID.CLIENT_AUTH),
            ("stranger", "other_ca", None, ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        issuer_name, issuer_key = cas[ca_name]
        cert = build("127.0.0.1" if san else f"rlinkd {leaf}", key, issuer_name, issuer_key,
                     ca=False, san=san, usage=usage)
        write_key(leaf, key)
        write_cert(leaf, cert)
    return files


def _pki_openssl(out: Path) -> dict[str, Path]:
    def openssl(*args: str) -> None:
        done = subprocess.run(["openssl", *args], cwd=out, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, f"openssl {' '.join(args)} failed:\n{done.stderr}"

    ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other_ca"):
        openssl("req", "-x509", *ec_key, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days",
                "2", "-subj", f"/CN=rlinkd test {ca}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    leaves = (("server", "ca", "/CN=127.0.0.1", "serverAuth\nsubjectAltName=IP:127.0.0.1"),
              ("client", "ca", "/CN=rlinkd client", "clientAuth"),
              ("stranger", "other_ca", "/CN=rlinkd stranger", "clientAuth"))
    for serial, (leaf, ca, subject, usage) in enumerate(leaves, start=2):
        (out / f"{leaf}.ext").write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
            f"extendedKeyUsage={usage}\n")
        openssl("req", "-new", *ec_key, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr",
                "-subj", subject)
        openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-set_serial", str(serial), "-days", "2", "-out", f"{leaf}.pem",
                "-extfile", f"{leaf}.ext")
    files = {}
    for name in ("ca", "other_ca", "server", "client", "stranger"):
        files[name], files[f"{name}_key"] = out / f"{name}.pem", out / f"{name}.key"
    return files


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


def client_context(pki, cert: str | None = None) -> ssl.SSLContext:
    """Python ssl, verifying the server against our CA (hostname 127.0.0.1 included)."""
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert:
        ctx.load_cert_chain(str(pki[cert]), str(pki[f"{cert}_key"]))
    return ctx


def tls_args(pki, client_ca: bool = False) -> list[str]:
    args = ["--set", f"server.tls_cert_file={pki['server']}",
            "--set", f"server.tls_key_file={pki['server_key']}"]
    if client_ca:
        args += ["--set", f"server.tls_client_ca_file={pki['ca']}"]
    return args


def assert_refused(pki, port: int, cert: str | None) -> None:
    """The TLS handshake or the first exchange fails; no PONG ever arrives."""
    client = RLlinkClient(f"tcp://127.0.0.1:{port}", timeout_s=10,
                          ssl_context=client_context(pki, cert))
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)) as caught:
        client.connect()  # TLS 1.3: the server's verdict on our certificate comes later
        client.ping()
    client.close()
    assert not isinstance(caught.value, socket.timeout), "refusal should be prompt"


# ---------------------------------------------------------------- TLS
def test_tls_client_talks_rlink_and_plaintext_gets_nothing(daemon_factory, pki):
    daemon = daemon_factory(*tls_args(pki))
    address = f"tcp://127.0.0.1:{daemon.port}"
    with RLlinkClient(address, timeout_s=30, ssl_context=client_context(pki)) as client:
        assert client.sock.version() in ("TLSv1.2", "TLSv1.3")
        assert dict(x[0] for x in client.sock.getpeercert()["subject"])["commonName"] == "127.0.0.1"
        client.ping()
        state = client.get_state()
        assert state.weights_seq_no >= 0 and len(state.onnx_file) > 1000

    # a plaintext RLlink client: the handshake fails, it never sees an RLlink reply
    plain = raw_connect(daemon.port, timeout_s=10)
    raw_send(plain, {"type": "PING"})
    received = b""
    try:
        while chunk := plain.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    plain.close()
    assert b"PONG" not in received and not received[:8].isdigit(), received[:64]

    # a client that does not trust our CA refuses the server
    untrusting = RLlinkClient(address, timeout_s=10, ssl_context=ssl.create_default_context())
    with pytest.raises(ssl.SSLCertVerificationError):
        untrusting.connect()

    # the daemon is healthy: the high-level client connects over TLS and acts
    agent = connect(address, ssl_context=client_context(pki), reconnect_timeout_s=30)
    try:
        assert agent.act(np.zeros(4, np.float32)) in (0, 1)
    finally:
        agent.close()
    status = daemon.status()
    assert status["protocol_errors"] == 0 and daemon.proc.poll() is None


def encoded(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return b"%08d" % len(body) + body


def test_tls_serving_connections_are_relayed_to_the_inference_role(daemon_factory, pki):
    """Server-side actions over TLS: the collector keeps the TLS state and copies bytes;
    the inference role frames and answers them. A client that goes away mid-episode ends
    the relay and frees its lane."""
    daemon = daemon_factory(*tls_args(pki))
    address = f"tls://127.0.0.1:{daemon.port}"
    agent = connect(address, ssl_context=client_context(pki), reconnect_timeout_s=30, inference="server")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    for _ in range(200):
        obs2, r, term, trunc, _ = env.step(agent.act(obs))
        agent.step(r, obs2, term, trunc)
        obs = env.reset()[0] if term or trunc else obs2
    inference = wait_for(lambda: (i := daemon.status()["inference"])["actions"] >= 200 and i, 20,
                         what="the role's report of the actions")
    assert inference["tls_relays"] == 1 and inference["direct_handed_over"] == 1, (
        inference["tls_relays"], inference["direct_handed_over"], agent.link.reconnects,
        {r: c["restarts"] for r, c in daemon.status()["children"].items()})
    assert inference["tcp_episodes_open"] == 1 and agent.link.reconnects == 0, inference
    agent.close()
    wait_for(lambda: (i := daemon.status()["inference"])["tls_relays"] == 0 and i["lanes_open"] == 0
             and i["direct_connections"] == 0, 20, what="the relay ended, its lane freed")
    # frames pipelined in one write reach the role once each, in order, with or without SERVE_DIRECT
    obs = [0.01, 0.02, 0.03, 0.04]
    for first, replies in (([{"type": "SERVE_DIRECT"}], ["SERVE_DIRECT_READY"]), ([], [])):
        with client_context(pki).wrap_socket(raw_connect(daemon.port), server_hostname="127.0.0.1") as tls:
            raw_send(tls, {"type": "PING"})
            assert raw_recv(tls)["type"] == "PONG"
            frames = [*first, {"type": "START_EPISODE", "episode_id": "p"},
                      {"type": "GET_ACTION", "episode_id": "p", "observation": obs},
                      {"type": "STEP", "episode_id": "p", "reward": 1.0, "observation": obs}]
            tls.sendall(b"".join(encoded(f) for f in frames))
            got = [raw_recv(tls)["type"] for _ in range(len(replies) + 3)]
            raw_send(tls, {"type": "PING"})  # (a frame carried twice would be answered first)
            got.append(raw_recv(tls)["type"])
            assert got == [*replies, "EPISODE_STARTED", "ACTION", "ACTION", "PONG"], got
    status = wait_for(lambda: (s := daemon.status())["env_steps"] >= 190 and s, 20, what="the steps counted")
    assert status["protocol_errors"] == 0 and daemon.proc.poll() is None


def test_tls_client_certificates_are_required_when_configured(daemon_factory, pki):
    daemon = daemon_factory(*tls_args(pki, client_ca=True))
    assert_refused(pki, daemon.port, cert=None)          # no certificate
    assert_refused(pki, daemon.port, cert="stranger")    # signed by another CA
    with RLlinkClient(f"tcp://127.0.0.1:{daemon.port}", timeout_s=30,
                      ssl_context=client_context(pki, "client")) as client:
        client.ping()
        assert client.get_config().observation_space["shape"] == [4]
        assert client.get_state().weights_seq_no >= 0
    assert daemon.proc.poll() is None and daemon.status()["protocol_errors"] == 0


# ---------------------------------------------------------------- the token
def token_status(daemon, token: str | None = TOKEN) -> dict:
    with RLlinkClient(f"unix://{daemon.unix_socket}", timeout_s=10) as client:
        return client.status(token)


def assert_error_and_closed(sock, contains: str) -> None:
    reply = raw_recv(sock)
    assert reply["type"] == "ERROR" and contains in reply["message"], reply
    assert peer_closed(sock), "the connection should be closed after ERROR"
    sock.close()


@pytest.fixture(scope="module")
def token_daemon(tmp_path_factory):
    """One daemon with ``server.token`` shared by the token tests (they count errors from a
    before-value; the SIGUSR1 checkpoint of the last one changes nothing they check)."""
    from tests.conftest import DaemonPool
    pool = DaemonPool(tmp_path_factory.mktemp("token"))
    yield pool.start("--set", f"server.token={TOKEN}")
    pool.close()


def test_token_is_required_before_anything_else(token_daemon):
    daemon = token_daemon
    errors = token_status(daemon)["protocol_errors"]
    good = raw_connect(daemon.port)
    raw_send(good, {"type": "PING", "token": TOKEN})
    assert raw_recv(good)["type"] == "PONG"
    raw_send(good, {"type": "GET_CONFIG"})
    assert raw_recv(good)["type"] == "SET_CONFIG"

    bad = [({"type": "PING", "token": "wrong"}, "wrong token"),
           ({"type": "PING", "token": TOKEN + "x"}, "wrong token"),
           ({"type": "PING"}, "authentication required"),
           ({"type": "GET_CONFIG"}, "authentication required"),
           ({"type": "GET_STATE", "token": TOKEN}, "authentication required"),
           ({"type": "EPISODES", "episodes": []}, "authentication required")]
    for msg, contains in bad:
        sock = raw_connect(daemon.port)
        raw_send(sock, msg)
        assert_error_and_closed(sock, contains)

    # the Unix socket too: STATUS needs the token (as rlinkd status sends RLINKD_TOKEN)
    for msg, contains in (({"type": "STATUS"}, "authentication required"),
                          ({"type": "STATUS", "token": "nope"}, "wrong token"),
                          ({"type": "GET_CONFIG"}, "authentication required")):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(daemon.unix_socket)
        raw_send(sock, msg)
        assert_error_and_closed(sock, contains)
    status = token_status(daemon)
    assert status["protocol_errors"] == errors + len(bad) + 3

    # the well-behaved connection was never disturbed
    raw_send(good, {"type": "GET_CONFIG"})
    assert raw_recv(good)["type"] == "SET_CONFIG"
    good.close()

    # client_lib: the right token works, a wrong one is an error (not retried)
    agent = connect(f"tcp://127.0.0.1:{daemon.port}", token=TOKEN, reconnect_timeout_s=30)
    try:
        assert agent.act(np.zeros(4, np.float32)) in (0, 1)
    finally:
        agent.close()
    with pytest.raises(ServerError, match="wrong token"):
        connect(f"tcp://127.0.0.1:{daemon.port}", token="guess", reconnect_timeout_s=5)
    env = dict(os.environ, RLINKD_TOKEN=TOKEN)
    done = subprocess.run([sys.executable, "-m", "rlinkd.daemon.cli", "status", "--json",
                           "--state-dir", str(daemon.state_dir)], capture_output=True,
                          text=True, timeout=60, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["protocol_errors"] == errors + len(bad) + 3 + 1  # + the "guess"
    # of everything since the last count, only connect(token="guess") was an error
    assert token_status(daemon)["protocol_errors"] == errors + len(bad) + 3 + 1


# ---------------------------------------------------------------- remote binds
def test_non_loopback_bind_without_tls_is_refused_at_start(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlinkd.daemon.cli", "serve", "--host", "0.0.0.0",
                           "--port", "0", "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == ExitCode.CONFIG == 78, output
    for word in ("server.host", "tls_cert_file", "insecure_remote"):
        assert word in output, output
    assert not (tmp_path / "state" / "daemon.json").exists()


def test_non_loopback_needs_tls_or_insecure_remote_in_config():
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.com"):
        with pytest.raises(ConfigError, match="insecure_remote"):
            load_config(overrides=[("server", "host", host)], resolve_dirs=False)
    cfg = load_config(overrides=[("server", "host", "0.0.0.0"),
                                 ("server", "insecure_remote", True)], resolve_dirs=False)
    assert cfg.server.host == "0.0.0.0" and cfg.server.insecure_remote is True
    cfg = load_config(overrides=[("server", "host", "0.0.0.0"),
                                 ("server", "tls_cert_file", "/x.pem"),
                                 ("server", "tls_key_file", "/x.key")], resolve_dirs=False)
    assert cfg.server.tls_cert_file == "/x.pem"
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert load_config(overrides=[("server", "host", host)], resolve_dirs=False)


# ---------------------------------------------------------------- permissions
def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_socket_segments_and_state_files_are_private(token_daemon):
    daemon = token_daemon
    earlier = (token_status(daemon).get("last_checkpoint") or {}).get("path")
    me = os.getuid()
    sock = os.stat(daemon.unix_socket)
    assert stat.S_ISSOCK(sock.st_mode) and mode(daemon.unix_socket) == 0o600
    runtime = Path(daemon.unix_socket).parent
    assert sock.st_uid == me and mode(runtime) & 0o077 == 0
    for entry in runtime.iterdir():  # the socket, the shm clients' doorbell FIFO, ...
        assert mode(entry) & 0o077 == 0 and entry.stat().st_uid == me, (entry, oct(mode(entry)))

    segments = [Path("/dev/shm", n) for n in daemon.leftover_segments()]
    names = {p.name.split(".")[3] for p in segments}  # <prefix>.<pid>.<token>.<kind>.<policy>
    assert {"episodes", "board", "slots", "snapshot"} <= names, names
    for path in segments:
        assert mode(path) == 0o600 and path.stat().st_uid == me, (path, oct(mode(path)))

    lock = daemon.state_dir / "rlinkd.lock"
    assert mode(lock) == 0o600 and lock.stat().st_uid == me

    # a checkpoint (SIGUSR1): it holds the config, token included; nobody else may read it
    daemon.signal(signal.SIGUSR1)
    ckpt = wait_for(lambda: (path := (token_status(daemon).get("last_checkpoint") or {}).get("path"))
                    != earlier and path, 60, 0.1, "a checkpoint")
    ckpt = Path(ckpt)
    assert TOKEN in (ckpt / "config.toml").read_text()
    files = sorted(ckpt.iterdir())
    assert {p.name for p in files} >= {"manifest.json", "config.toml", "learner.pt",
                                       "policy.onnx"}
    for path in [ckpt.parent, ckpt, *files]:
        assert mode(path) & 0o077 == 0, f"{path} is {oct(mode(path))}"
        assert path.stat().st_uid == me


# ---------------------------------------------------------------- no pickle on any wire
FORBIDDEN_CALLS = {("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"),
                   ("marshal", "loads"), ("marshal", "load"), ("dill", "loads"),
                   ("cloudpickle", "loads"), ("shelve", "open")}
FORBIDDEN_NAMES = {"eval", "exec", "__import__"}
UNPICKLING_MODULES = ("pickle", "marshal", "dill", "cloudpickle", "shelve")
# (file, what) pairs allowed, each with its reason:
ALLOWED = {
    # The single-step ring writer is generated code: the template's only substitutions are
    # identifier lists and sizes built from three integers of a flat StepLayout (the float
    # count of its one obs field, action and dist sizes), which StepLayout checks and
    # coerces with int() (and _names() runs range() on them first). No peer byte, string
    # or field name reaches the source; it is a code-generation speed-up, not deserialisation.
    ("shm/_stepwriter.py", "exec("),
}
# Not source-visible, and not a wire: multiprocessing's spawn pickles the wiring the
# supervisor hands its own children through private pipes; no client byte reaches it.


def _violations(path: Path) -> list[tuple[str, int, str]]:
    """(what, line, detail) for every forbidden import or call in one file (AST based)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(
                node, ast.ImportFrom) and node.module else [])
            if any(n.split(".")[0] in UNPICKLING_MODULES for n in names):
                found.append(("import", node.lineno, f"imports {names}"))
        if not isinstance(node, ast.Call):
            continue
        func, kwargs = node.func, {k.arg: k.value for k in node.keywords}
        if isinstance(func, ast.Name) and func.id in FORBIDDEN_NAMES:
            found.append((f"{func.id}(", node.lineno, "call"))
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            pair = (func.value.id, func.attr)
            if pair in FORBIDDEN_CALLS:
                found.append((f"{pair[0]}.{pair[1]}(", node.lineno, "call"))
            if pair == ("torch", "load"):
                weights_only = kwargs.get("weights_only")
                if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                    found.append(("torch.load(", node.lineno, "without weights_only=True"))
            if pair in (("np", "load"), ("numpy", "load")):
                allow = kwargs.get("allow_pickle")
                if allow is not None and not (isinstance(allow, ast.Constant) and
                                              allow.value is False):
                    found.append(("np.load(", node.lineno, "allow_pickle"))
    return found


TEXT_PATTERNS = re.compile(r"pickle\.loads?\(|\beval\(|\bexec\(|__import__\(|torch\.load\(")


def test_no_pickle_eval_or_exec_in_the_source():
    sources = [p for d in ("daemon", "client_lib", "shm") for p in sorted((REPO / d).rglob("*.py"))]
    assert len(sources) > 30, sources
    found = []
    for path in sources:
        rel = str(path.relative_to(REPO))
        found += [f"{rel}:{line}: {what} {detail}" for what, line, detail in _violations(path)
                  if (rel, what) not in ALLOWED]
        # textually too (a string handed to something else, getattr tricks): each torch.load
        # mention must say weights_only=True on its line, the rest must not appear at all
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            for match in TEXT_PATTERNS.finditer(code):
                what = match.group(0)
                if (rel, what) in ALLOWED or (what == "torch.load(" and "weights_only=True" in code):
                    continue
                found.append(f"{rel}:{lineno}: {line.strip()}")
    assert not found, "code-executing deserialisation or eval in the source:\n" + "\n".join(found)
    # the allowlist is not stale
    for rel, what in ALLOWED:
        assert what in (REPO / rel).read_text(), (rel, what)
