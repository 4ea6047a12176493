"""Learning-curve pictures from the result files: rlinkd beside its peers (matplotlib, Agg).

    .venv/bin/python -m bench.report.plots [--out DIR]

One PNG per definition of "solved" (``FIGURES``), each with two panels: mean return against
env steps and against wall seconds since launch, one line per run (``curve`` in the result
files, ``bench.harness.curves``), one colour per system and configuration, the 450 target
dashed. rlinkd's curves come from ``bench.scenarios.rlinkd_solve`` results
(``RLINKD_CURVE_FILES``), RLlib's from ``rllib.json`` (``bench.scenarios.rllib_baseline``);
a run recorded before curves were kept is drawn as one marker where it reached the target.
``ENV_FIGURES``: one PNG per further environment (Pendulum SAC and LunarLander PPO beside
Stable-Baselines3, CartPole's algorithms), from those scenarios' result files. Called by
``bench.run_all`` before it writes the BENCHMARKS.md section, which shows ``PLOTS_DIR``'s
pictures; ``series`` (what is drawn) is pure, ``draw`` only renders it.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt
from matplotlib.ticker import FuncFormatter

from bench.harness.common import REPO, RESULTS

PLOTS_DIR = RESULTS / "plots"
TARGET_RETURN = 450.0


@dataclass(frozen=True)
class CurveFigure:
    """One picture: rlinkd's ``rlinkd`` section of solve_compare.json beside RLlib's ``rllib``
    mode of rllib.json (the same definition of solved on both sides)."""

    file: str
    title: str
    rlinkd: str
    rllib: str


FIGURES = (
    CurveFigure("learning_curves_client.png", "CartPole-v1, client-side mean return of the last 100 episodes "
                "(rlinkd clients / RLlib's external client)", "client", "external"),
    CurveFigure("learning_curves_own.png", "CartPole-v1, each system's own criterion (rlinkd demo: daemon's "
                "last-20 mean; RLlib example: episode_return_mean)", "own", "example"),
)


@dataclass(frozen=True)
class EnvFigure:
    """One picture per environment from scenario result files (``results``: the systems of
    every file that exists, merged): a line per run of each system or algorithm (``systems``
    or ``algorithms`` of each document), ``target`` dashed."""

    file: str
    title: str
    results: tuple[str, ...]
    target: float
    ylim: tuple[float, float]


ENV_FIGURES = (
    EnvFigure("curves_pendulum_sac.png", "Pendulum-v1, SAC: rlinkd and Stable-Baselines3, 20,000 env steps "
              "(mean return of the last 10 training episodes)", ("sac_pendulum.json",), -200.0, (-1700.0, 0.0)),
    EnvFigure("curves_lunarlander_ppo.png", "LunarLander-v3, PPO with a 1,000,000-step budget: rlinkd and "
              "Stable-Baselines3 (mean return of the last 20 training episodes; rlinkd: the daemon's)",
              ("lunar.json", "lunar_sb3.json"), 200.0, (-500.0, 320.0)),
    EnvFigure("curves_cartpole_dqn_budget.png", "CartPole-v1, DQN with a 50,000-step budget: rlinkd and "
              "Stable-Baselines3 (mean return of the last 10 training episodes, epsilon-greedy)",
              ("dqn_cartpole_zoo_sb3_decay40k_pub10.json", "dqn_cartpole_zoo_sb3_decay40k_pub10_s34.json",
               "dqn_cartpole_zoo_sb3_decay40k_pub10_rerun.json", "dqn_cartpole_sb3.json"),
              500.0, (0.0, 520.0)),
    EnvFigure("curves_cartpole_algorithms.png", "CartPole-v1: rlinkd's PPO and APPO (2 TCP clients; daemon's "
              "mean return of the last 20 episodes) beside RLlib 2.60.0's PPO (its own criterion)",
              ("offpolicy_appo_tcp_s5.json", "rllib_appo_compare.json"), 450.0, (0.0, 520.0)),
)


@dataclass
class Series:
    """One legend entry: ``curves`` drawn as lines, ``reached`` as markers (wall s, env steps)."""

    label: str
    curves: list[dict] = field(default_factory=list)
    reached: list[tuple[float, float]] = field(default_factory=list)


def series(fig: CurveFigure, solve: dict | None, rllib: dict | None) -> list[Series]:
    """What ``fig`` draws from the two result documents (either may be None)."""
    out = []
    for config, section in ((solve or {}).get(fig.rlinkd) or {}).items():
        out.append(_series(f"rlinkd {config.replace('x', ' × ')} client(s)", section.get("runs") or []))
    for version, doc in ((rllib or {}).get("versions") or {}).items():
        runs = (((doc.get("modes") or {}).get(fig.rllib)) or {}).get("runs") or []
        out.append(_series(f"RLlib {version} ({fig.rllib})", runs))
    return [s for s in out if s.curves or s.reached]


def _series(label: str, runs: list[dict], target: float = TARGET_RETURN) -> Series:
    curves = [r["curve"] for r in runs if (r.get("curve") or {}).get("env_steps")]
    reached = [(r["wall_s"], r["env_steps"]) for r in runs if not r.get("curve") and r.get("solved")
               and r.get("wall_s") and r.get("env_steps")]
    if reached:
        label += f": reached {target:g} here (run recorded without a curve)"
    return Series(label, curves, reached)


def env_series(fig: EnvFigure, doc: dict | None) -> list[Series]:
    """What an EnvFigure draws from its result document (None: nothing)."""
    sections = (doc or {}).get("systems") or (doc or {}).get("algorithms") or {}
    out = [_series(name, section.get("runs") or [], fig.target) for name, section in sections.items()]
    return [s for s in out if s.curves or s.reached]


def draw(fig: CurveFigure | EnvFigure, drawn: list[Series], path: Path) -> Path:
    """Render ``drawn`` into the PNG at ``path`` (two panels: env steps, wall seconds)."""
    target, ylim = ((fig.target, fig.ylim) if isinstance(fig, EnvFigure)
                    else (TARGET_RETURN, (0.0, TARGET_RETURN + 70)))
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(drawn):
        colour = colours[i % len(colours)]
        for ax, x in zip(axes, ("env_steps", "wall_s")):
            for j, curve in enumerate(s.curves):
                ax.plot(curve[x], curve["return_mean"], color=colour, lw=1.2, alpha=0.85,
                        label=s.label if j == 0 else None)
            if s.reached:
                xs = [steps if x == "env_steps" else wall for wall, steps in s.reached]
                ax.scatter(xs, [target] * len(xs), color=colour, marker="X", s=60, zorder=3,
                           label=None if s.curves else s.label)
    for ax, xlabel in zip(axes, ("env steps", "wall seconds since launch")):
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylim(*ylim)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean return")
    axes[0].legend(fontsize=7, loc="lower right")
    figure.suptitle(fig.title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def draw_all(solve: dict | None, rllib: dict | None, out_dir: Path = PLOTS_DIR) -> list[Path]:
    """Every figure with something to draw; the PNGs written (others are left alone)."""
    written = []
    for fig in FIGURES:
        drawn = series(fig, solve, rllib)
        if drawn:
            written.append(draw(fig, drawn, out_dir / fig.file))
    return written


def merged(docs) -> dict:
    """One document of the ``systems``/``algorithms`` of several (missing ones skipped; an
    ``rllib_baseline`` result's ``versions``/``modes`` become systems "RLlib V PPO (mode)"); runs
    of a system named in more than one are joined in order."""
    out: dict[str, dict] = {}
    for doc in docs:
        for name, section in _sections(doc or {}):
            out.setdefault(name, {"runs": []})["runs"] += section.get("runs") or []
    return {"systems": out}


def _sections(doc: dict) -> list[tuple[str, dict]]:
    if "versions" in doc:
        return [(f"RLlib {version} PPO ({mode})", section) for version, v in doc["versions"].items()
                for mode, section in (v.get("modes") or {}).items()]
    return list((doc.get("systems") or doc.get("algorithms") or {}).items())


def draw_envs(results_dir: Path = RESULTS, out_dir: Path = PLOTS_DIR) -> list[Path]:
    """Every ENV_FIGURES picture whose result file has runs to draw; the PNGs written."""
    written = []
    for fig in ENV_FIGURES:
        drawn = env_series(fig, merged(_load(results_dir / name) for name in fig.results))
        if drawn:
            written.append(draw(fig, drawn, out_dir / fig.file))
    return written


def markdown(paths: list[Path], base: Path = REPO) -> str:
    """Image links for BENCHMARKS.md (paths relative to ``base``, the file's folder)."""
    titles = {fig.file: fig.title for fig in (*FIGURES, *ENV_FIGURES)}
    return "\n\n".join(f"![{titles.get(p.name, p.stem)}]({p.relative_to(base).as_posix()})" for p in paths)


RLINKD_CURVE_FILES = ("solve_compare.json", "solve_curves.json")
"""Where rlinkd's curves are read, first file with a curve wins: the published time-to-solve
results, else a run made for the curves alone (``rlinkd_solve --out .../solve_curves.json``)."""


def caption(rlinkd: dict | None, rllib: dict | None) -> str:
    """Where the drawn runs come from: command, time and load average of each document."""
    def source(name: str, doc: dict | None) -> str:
        if not doc:
            return f"{name}: no results"
        return (f"{name}: `{doc.get('command')}` ({doc.get('measured_at')}, load average "
                f"{doc.get('load_avg_1m_at_end')} at the end)")
    return ("Drawn from " + "; ".join((source("rlinkd", rlinkd), source("RLlib", rllib))) + ". One line per "
            "run; an X marks where a run recorded without its curve reached 450. Wall seconds depend on "
            "the machine's load, env steps hardly.")


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _has_curve(doc: dict | None) -> bool:
    return any(r.get("curve") for crit in ("own", "client") for section in ((doc or {}).get(crit) or {}).values()
               for r in section.get("runs") or [])


def rlinkd_curves(results_dir: Path = RESULTS) -> dict | None:
    """The rlinkd result document to draw (see ``RLINKD_CURVE_FILES``); the first file when
    none has a curve (its runs are then drawn as markers), None when none exists."""
    docs = [doc for name in RLINKD_CURVE_FILES if (doc := _load(results_dir / name)) is not None]
    return next((doc for doc in docs if _has_curve(doc)), docs[0] if docs else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PLOTS_DIR, help="folder of the PNGs")
    args = ap.parse_args()
    for path in [*draw_all(rlinkd_curves(), _load(RESULTS / "rllib.json"), args.out),
                 *draw_envs(RESULTS, args.out)]:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
