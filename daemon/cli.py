"""``rlinkd`` command line: serve, client, status, demo, checkpoint, reload, export, config.

The serve flags are shorthands for config keys (``--port`` = ``server.port``);
``--set section.key=value`` reaches every other key, so the TOML file, the CLI and
the docs share one declaration (``daemon.config``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from rlinkd.client_lib.protocol.onnx_opsets import ONNX_OPSET, OpsetError
from rlinkd.daemon.errors import CheckpointError, ConfigError, ExitCode, ExportError, UnknownPolicyError
from rlinkd.daemon.runfiles import query_status

SERVE_SHORTHANDS = {"host": "server.host", "port": "server.port", "env": "env.id",
                    "state_dir": "daemon.state_dir", "runtime_dir": "daemon.runtime_dir",
                    "log_level": "daemon.log_level"}


def _add_state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", help="the daemon's state directory (default: as `serve`)")


def _add_timeout(p: argparse.ArgumentParser, default: float, what: str) -> None:
    p.add_argument("--timeout-s", type=float, default=default,
                   help=f"give up after this many seconds {what} (default: %(default)g)")


def _add_shorthand(p: argparse.ArgumentParser, attr: str, dotted: str) -> None:
    """``serve --ATTR`` for config key ``dotted``: type and help from its declaration."""
    from rlinkd.daemon.config import key_declaration
    hint, f = key_declaration(dotted)
    doc = f.metadata["doc"].replace("%", "%%")  # argparse %-formats help texts
    convert = hint if hint in (int, float) else str
    p.add_argument(f"--{attr.replace('_', '-')}", type=convert, help=f"{doc} (config key {dotted})")


def _add_overrides(p: argparse.ArgumentParser, whose: str) -> None:
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help=f"set any config key for {whose}; the value is TOML (a bare word is "
                        "a string); repeatable; `rlinkd config --docs` lists the keys")


def build_parser() -> argparse.ArgumentParser:
    from rlinkd.daemon.version import package_version
    parser = argparse.ArgumentParser(prog="rlinkd", description="RL training daemon for "
                                     "external simulators (RLlink over TCP, shared memory).")
    parser.add_argument("--version", action="version", version=f"rlinkd {package_version()}",
                        help="print rlinkd's version and exit")
    sub = parser.add_subparsers(dest="verb", required=True)
    _add_serve(sub.add_parser("serve", help="run the daemon in the foreground"))
    _add_client(sub.add_parser("client", help="run a gymnasium env as an RLlink client"))

    status = sub.add_parser("status", help="show the running daemon's status")
    status.add_argument("--json", action="store_true", help="the full status as JSON")
    _add_state_dir(status)

    _add_demo(sub.add_parser("demo", help="daemon + local CartPole clients until solved"))
    for verb, text in (("checkpoint", "checkpoint now (SIGUSR1) and wait for it"),
                       ("reload", "re-read the config file (SIGHUP) and wait for the result")):
        p = sub.add_parser(verb, help=text)
        _add_timeout(p, 120.0, "waiting for the daemon's answer")
        _add_state_dir(p)
    _add_export(sub.add_parser("export", help="write a checkpoint's policy as ONNX + JSON "
                               "space description"))

    config = sub.add_parser("config", help="print the effective config or the key reference")
    config.add_argument("--config", help="TOML config file to read (default: built-in defaults)")
    config.add_argument("--docs", action="store_true", help="markdown table of every key")
    return parser


def _add_serve(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--config", help="TOML config file")
    for attr, dotted in SERVE_SHORTHANDS.items():
        _add_shorthand(serve, attr, dotted)
    _add_overrides(serve, "this run (over --config; the flags above win over --set)")
    serve.add_argument("--fresh", action="store_true",
                       help="start a new run: existing checkpoints are moved into "
                            "checkpoints/previous-<UTC time>/ (kept, never resumed)")
    serve.add_argument("--in-process", action="store_true",
                       help="debugging: every role as a thread of one process (no restarts)")


def _add_client(client: argparse.ArgumentParser) -> None:
    client.add_argument("--env", default="CartPole-v1",
                        help="gymnasium id of the environment to run (default: %(default)s)")
    client.add_argument("--connect", default="tcp://127.0.0.1:5555",
                        help="tcp://HOST:PORT, unix:///PATH, shm, shm:STATE_DIR, "
                             "shm:///PATH/rlinkd.sock or auto (table: docs/c-client.md#addresses; "
                             "default: %(default)s)")
    client.add_argument("--steps", type=int, help="stop after this many env steps "
                        "(default: run until stopped)")
    client.add_argument("--episodes", type=int, help="stop after this many episodes "
                        "(default: run until stopped)")
    client.add_argument("--token", help="the daemon's shared secret (`server.token`), if set")
    client.add_argument("--seed", type=int, help="seeds the env resets and the action sampling")
    client.add_argument("--greedy", action="store_true", help="no exploration")
    client.add_argument("--num-envs", type=int, default=1, metavar="N",
                        help="step N copies of the env in this process (a gymnasium vector "
                             "env, one connection, one batched act per step; default: "
                             "%(default)s)")
    client.add_argument("--inference", choices=("client", "server"), default="client",
                        help="where actions are chosen: in this process (client) or by the "
                             "daemon's inference role (server; default: %(default)s)")
    client.add_argument("--report-every-s", type=float, default=5.0,
                        help="seconds between JSON progress lines (default: %(default)g)")
    _add_state_dir(client)


def _add_demo(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--clients", type=int, default=2,
                      help="CartPole client processes to start (default: %(default)s)")
    demo.add_argument("--transport", choices=("tcp", "shm", "mixed"), default="tcp",
                      help="how the clients connect; mixed alternates TCP and shared memory "
                           "(default: %(default)s)")
    demo.add_argument("--num-envs", type=int, default=1, metavar="N",
                      help="env copies each client steps (a vectorized client; default: "
                           "%(default)s)")
    demo.add_argument("--inference", choices=("client", "server"), default="client",
                      help="the clients' actions: chosen by each client, or served by the "
                           "daemon (default: %(default)s)")
    demo.add_argument("--target", type=float, default=450.0,
                      help="stop, solved, once the mean return of the last 20 episodes "
                           "reaches this (default: %(default)g)")
    _add_timeout(demo, 900.0, "if the target is not reached")
    _add_overrides(demo, "the demo's daemon")
    demo.add_argument("--state-dir", help="keep the demo's state here (default: a temp dir)")
    demo.add_argument("--seed", type=int, default=0,
                      help="seeds the learner and (offset per client) the clients")


def _add_export(export: argparse.ArgumentParser) -> None:
    source = export.add_mutually_exclusive_group()
    source.add_argument("--state-dir", help="export the newest valid checkpoint of this state "
                        "directory (default: as `serve`)")
    source.add_argument("--checkpoint", metavar="PATH",
                        help="export this checkpoint (a ckpt-NNNNNN directory) instead")
    export.add_argument("--policy", default="default", metavar="NAME",
                        help="which policy to export (default: %(default)s; a checkpoint "
                             "holds every trainable policy, see [policies.NAME])")
    export.add_argument("--out", required=True, metavar="FILE.onnx",
                        help="the ONNX file to write; its description goes beside it as "
                             "FILE.json (replaced atomically if they exist)")
    export.add_argument("--opset", type=int, default=ONNX_OPSET, metavar="N",
                        help="the ONNX opset to stamp, for a runtime that wants another "
                             "(default: %(default)s, the lowest that carries every operator; "
                             "one that cannot carry the network's operators is an error)")


def serve_overrides(args: argparse.Namespace) -> list:
    from rlinkd.daemon.config import parse_override
    overrides = [parse_override(text) for text in args.set]
    for attr, dotted in SERVE_SHORTHANDS.items():
        value = getattr(args, attr, None)
        if value is not None:
            section, key = dotted.split(".")
            overrides.append((section, key, value))
    return overrides


def cmd_serve(args: argparse.Namespace) -> int:
    from rlinkd.daemon import log as logsetup
    from rlinkd.daemon.config import load_config
    from rlinkd.daemon.supervisor import Supervisor
    overrides = serve_overrides(args)
    cfg = load_config(args.config, overrides)
    logsetup.configure(cfg.daemon.log_level, "supervisor")
    if args.in_process:
        return serve_in_process(cfg)
    return Supervisor(cfg, overrides, fresh=args.fresh).run()


def serve_in_process(cfg) -> int:
    """``serve --in-process``: run until Ctrl-C, then stop every role thread."""
    from rlinkd.daemon.inprocess import InProcessDaemon
    daemon = InProcessDaemon(cfg).start()
    listening = daemon.listening
    assert listening is not None, "InProcessDaemon.start() returns once the collector listens"
    print(f"rlinkd (in-process) listening on {listening.host}:{listening.port}; "
          "Ctrl-C stops", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    codes = daemon.stop()
    return max(codes.values(), default=0)


def state_dir_of(args: argparse.Namespace) -> Path:
    from rlinkd.daemon.config import default_state_dir
    return Path(args.state_dir).expanduser().resolve() if args.state_dir else default_state_dir()


def running_daemon(args: argparse.Namespace) -> dict:
    from rlinkd.daemon.runfiles import read_daemon_file
    info = read_daemon_file(state_dir_of(args))
    if info is None:
        raise SystemExit(_fail(f"no running rlinkd found for state dir {state_dir_of(args)}",
                               ExitCode.NOT_RUNNING))
    return info


def cmd_status(args: argparse.Namespace) -> int:
    status = query_status(running_daemon(args))
    if args.json:
        print(json.dumps(status, indent=1, sort_keys=True))
    else:
        print(format_status(status))
    return 0


def format_status(s: dict) -> str:
    ckpt = s.get("last_checkpoint") or {}
    lines = [f"rlinkd pid {s.get('daemon_pid')}  {s.get('state', '?')}  up {s.get('uptime_s')} s  "
             f"tcp {s.get('host')}:{s.get('port')}",
             f"env_steps {s.get('env_steps')}  ({s.get('env_steps_per_s')}/s)  episodes "
             f"{s.get('episodes')}  return mean {s.get('episode_return_mean')}",
             f"weights_seq_no {s.get('weights_seq_no')}  clients {s.get('clients')}  dropped "
             f"{s.get('dropped_episodes')}  protocol_errors {s.get('protocol_errors')}",
             f"connections {s.get('connections')} ({s.get('pending_connections')} in handshake)  "
             f"evicted {s.get('evicted_connections')}  handshake_timeouts {s.get('handshake_timeouts')}  "
             f"refused {s.get('refused_connections')}",
             f"last checkpoint {ckpt.get('path', '-')} (age {ckpt.get('age_s', '-')} s)"]
    if s.get("metrics_url"):
        lines.append(f"metrics {s['metrics_url']}")
    policies = s.get("policies") or {}
    if len(policies) > 1 or s.get("agents"):
        lines.append(f"agents with an episode in progress {s.get('agents', 0)}")
        for name, p in policies.items():
            lines.append(f"  policy {name:<12} seq_no {p.get('weights_seq_no')}  "
                         f"{'trained' if p.get('trainable') else 'frozen'}  env_steps "
                         f"{p.get('env_steps')}  episodes {p.get('episodes')}  return mean "
                         f"{p.get('episode_return_mean')}")
    lines += _device_lines(policies) + _cluster_lines((s.get("learner") or {}).get("cluster"))
    for role, c in (s.get("children") or {}).items():
        lines.append(f"  {role:<12} pid {c.get('pid')}  restarts {c.get('restarts')}")
    return "\n".join(lines)


def _cluster_lines(cluster: dict | None) -> list[str]:
    """A rank of a job: its place, the members, the last update's collective time and rows."""
    if not cluster:
        return []
    return [f"cluster rank {cluster['rank']} of {cluster['world_size']}  members "
            f"{cluster['members']}  generation {cluster['generation']}  collective "
            f"{1000 * cluster['collective_time_s']:.1f} ms/update  rows per rank "
            f"{cluster['rows_per_rank']}  weights {cluster['weights_digest']}"]


def _device_lines(policies: dict) -> list[str]:
    """One line per trained policy: its device, why, and the timings ``auto`` compared."""
    lines = []
    for name, p in policies.items():
        learner = p.get("learner") or {}
        if learner.get("device"):
            timed = ", ".join(f"{d} {1000 * t:.2f} ms" for d, t in
                              (learner.get("device_step_s") or {}).items())
            lines.append(f"learner {name} on {learner['device']} ({learner.get('device_choice')}"
                         f"{': ' + timed + ' per SGD step' if timed else ''})")
    return lines


def _signal_and_wait(args: argparse.Namespace, sig: int, key: str, describe) -> int:
    """Send ``sig`` to the daemon and wait until status ``key`` changes; print the outcome."""
    info = running_daemon(args)
    before = query_status(info).get(key)
    os.kill(int(info["pid"]), sig)
    deadline = time.monotonic() + args.timeout_s
    while time.monotonic() < deadline:
        status = query_status(info)
        if status.get(key) != before:
            return describe(status)
        time.sleep(0.1)
    return _fail(f"timed out after {args.timeout_s:g} s waiting for the daemon", ExitCode.TIMEOUT)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """SIGUSR1, then wait for the outcome of that request (``signal_checkpoint_request``)."""
    info = running_daemon(args)
    status = query_status(info)
    cluster = (status.get("learner") or {}).get("cluster") or {}
    if cluster.get("rank", 0) != 0:
        return _fail(f"this daemon is rank {cluster['rank']} of a job: rank 0 writes the job's "
                     "checkpoints (run this against rank 0)", ExitCode.USAGE)
    before, asked = status.get("signal_checkpoint_request", 0), 0
    os.kill(int(info["pid"]), signal.SIGUSR1)
    deadline = time.monotonic() + args.timeout_s
    while time.monotonic() < deadline:
        status = query_status(info)
        latest = status.get("signal_checkpoint_request", 0)
        asked = asked or (latest if latest > before else 0)
        outcome = _checkpoint_outcome(status, asked)
        if outcome is not None:
            return outcome
        time.sleep(0.1)
    return _fail(f"timed out after {args.timeout_s:g} s waiting for the daemon", ExitCode.TIMEOUT)


def _checkpoint_outcome(status: dict, asked: int) -> int | None:
    """The exit code once the checkpoint request ``asked`` (0: not seen yet) ended: its path
    printed (or a newer checkpoint's: requests are answered in order), or the failure's
    reason with CANT_CREATE; None while it runs. A stopping daemon takes no request."""
    written, failed = status.get("last_checkpoint", {}), status.get("last_checkpoint_failure", {})
    if asked and written.get("request_id", 0) >= asked:
        print(written["path"])
        return 0
    if asked and failed.get("request_id", 0) >= asked:
        return _fail(f"the checkpoint failed: {failed.get('error')}", ExitCode.CANT_CREATE)
    if not asked and status.get("state") == "stopping":
        return _fail("the daemon is stopping: it writes its final checkpoint itself", ExitCode.NOT_RUNNING)
    return None


def cmd_reload(args: argparse.Namespace) -> int:
    def describe(status: dict) -> int:
        result = status.get("last_reload", {})
        print(json.dumps(result, sort_keys=True))
        return 0 if result.get("ok") else int(ExitCode.CONFIG)
    return _signal_and_wait(args, signal.SIGHUP, "reload_generation", describe)


def cmd_client(args: argparse.Namespace) -> int:
    from rlinkd.daemon.client_cmd import run_client
    return run_client(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from rlinkd.daemon.demo import run_demo
    return run_demo(args)


def cmd_export(args: argparse.Namespace) -> int:
    from rlinkd.daemon.export import export_policy
    state_dir = state_dir_of(args)
    warn = lambda text: print(f"rlinkd: skipping {text}", file=sys.stderr)  # noqa: E731
    try:
        result = export_policy(args.out, state_dir, args.checkpoint, args.policy, warn, args.opset)
    except CheckpointError as exc:
        return _fail(str(exc), ExitCode.NO_INPUT)
    except (UnknownPolicyError, OpsetError) as exc:
        return _fail(str(exc), ExitCode.USAGE)
    except ExportError as exc:
        return _fail(str(exc), ExitCode.CANT_CREATE)
    print(f"wrote {result.onnx_path} and {result.sidecar_path} (weights_seq_no "
          f"{result.weights_seq_no}, from {result.checkpoint})")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from rlinkd.daemon.config import docs_markdown, load_config, to_toml
    print(docs_markdown() if args.docs else to_toml(load_config(args.config)), end="")
    return 0


def _fail(message: str, code: int) -> int:
    print(f"rlinkd: {message}", file=sys.stderr)
    return int(code)


VERBS = {"serve": cmd_serve, "client": cmd_client, "status": cmd_status, "demo": cmd_demo,
         "checkpoint": cmd_checkpoint, "reload": cmd_reload, "export": cmd_export,
         "config": cmd_config}


THREAD_POOL_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_thread_pools() -> None:
    """One BLAS/OpenMP thread per process unless the user chose otherwise.

    Must run before numpy is imported (children inherit it). OpenBLAS's worker threads
    spin-wait after every multi-threaded matmul: in the connector (batch value forward
    passes) they burned most of a core and starved the learner on a 2-core machine.
    The learner's torch threads are set separately (``learner.torch_threads``).
    """
    for var in THREAD_POOL_VARS:
        os.environ.setdefault(var, "1")


def main(argv: list[str] | None = None) -> int:
    limit_thread_pools()
    args = build_parser().parse_args(argv)
    try:
        return VERBS[args.verb](args)
    except ConfigError as exc:
        return _fail(f"config error: {exc}", ExitCode.CONFIG)
    except (ConnectionError, FileNotFoundError) as exc:
        return _fail(str(exc), ExitCode.NOT_RUNNING)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
