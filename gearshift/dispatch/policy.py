"""The oracle policy map: (mode, group, N, K, M bucket) -> (strategy, tile config), as JSON.

Written by the offline profiler once per model and device; read at model load. Lookup is a
dict hit on the static GEMM type plus an index into a short, fixed bucket list (M rounds up to
the next bucket, clipped to the largest): no search, no timing at run time.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from gearshift.jsonfile import read_text, resolve, write_text
from gearshift.kernels.config import TileConfig


class PolicyMapWarning(UserWarning):
    """A policy map file the engine found could not be read and was skipped."""


M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
POLICY_VERSION = 1


@dataclass(frozen=True)
class Choice:
    strategy: str
    config: TileConfig | None
    us: float | None = None

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "config": None if self.config is None else self.config.to_dict(),
                "us": self.us}

    @classmethod
    def from_dict(cls, d: dict) -> "Choice":
        cfg = d.get("config")
        return cls(d["strategy"], None if cfg is None else TileConfig.from_dict(cfg), d.get("us"))


def type_key(mode: str, group: int, n: int, k: int) -> str:
    return f"{mode}:g{group}:{n}x{k}"


def parse_type_key(key: str) -> tuple[str, int, int, int] | None:
    """`type_key`'s inverse: (mode, group, N, K), or None for a key of another form."""
    parts = key.split(":")
    dims = parts[2].split("x") if len(parts) == 3 else ()
    if len(dims) != 2 or not parts[1].startswith("g"):
        return None
    try:
        return parts[0], int(parts[1][1:]), int(dims[0]), int(dims[1])
    except ValueError:
        return None


def device_slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


class PolicyMap:
    def __init__(self, device: str, buckets=M_BUCKETS, entries: dict | None = None, timings: dict | None = None,
                 meta: dict | None = None):
        self.device = device
        self.buckets = tuple(int(b) for b in buckets)
        self.entries: dict[str, list[Choice | None]] = entries or {}
        self.timings = timings or {}  # type_key -> {M: {candidate: us}} (for ablations)
        self.meta = meta or {}
        self._lut = [self._bucket_index(m) for m in range(self.buckets[-1] + 1)]

    def _bucket_index(self, m: int) -> int:
        return min(bisect.bisect_left(self.buckets, max(m, 1)), len(self.buckets) - 1)

    def bucket_index(self, m: int) -> int:
        return self._lut[m] if m < len(self._lut) else len(self.buckets) - 1

    def set(self, key: str, m: int, choice: Choice) -> None:
        row = self.entries.setdefault(key, [None] * len(self.buckets))
        row[self.buckets.index(m)] = choice

    def lookup(self, key: str, m: int) -> Choice | None:
        row = self.entries.get(key)
        if row is None:
            return None
        i = self.bucket_index(m)
        c = row[i]
        if c is None:  # nearest filled bucket
            for d in range(1, len(row)):
                for j in (i - d, i + d):
                    if 0 <= j < len(row) and row[j] is not None:
                        return row[j]
        return c

    # --- JSON -------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "version": POLICY_VERSION, "device": self.device, "buckets": list(self.buckets), "meta": self.meta,
            "entries": {k: {str(self.buckets[i]): c.to_dict() for i, c in enumerate(row) if c is not None}
                        for k, row in self.entries.items()},
            "timings": self.timings,
        }

    @classmethod
    def from_json(cls, d: dict) -> "PolicyMap":
        buckets = tuple(d.get("buckets", M_BUCKETS))
        entries = {}
        for k, row in d.get("entries", {}).items():
            lst: list[Choice | None] = [None] * len(buckets)
            for m, c in row.items():
                if int(m) in buckets:
                    lst[buckets.index(int(m))] = Choice.from_dict(c)
            entries[k] = lst
        return cls(d["device"], buckets, entries, d.get("timings", {}), d.get("meta", {}))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the map in one step (a temporary file renamed over the path): a run killed mid-write,
        e.g. a profile checkpoint under `timeout`, never leaves half a map behind."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp{p.suffix if p.suffix == '.gz' else ''}")
        write_text(tmp, json.dumps(self.to_json(), indent=1))  # gzipped where the path ends in .gz
        os.replace(tmp, p)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PolicyMap":
        """The map in a JSON file, plain or gzipped (`gearshift.jsonfile`). Raises OSError where the file cannot
        be read, ValueError (naming the file) where it is not a policy map: malformed JSON, or JSON of another
        shape."""
        try:
            text = read_text(path)
        except (EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not a gearshift policy map ({type(e).__name__}: {e})") from None
        try:
            return cls.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path} is not a gearshift policy map ({type(e).__name__}: {e})") from None

    def points(self) -> int:
        """How many (shape and mode, M bucket) points hold a pick."""
        return sum(c is not None for row in self.entries.values() for c in row)

    def fill_from(self, other: "PolicyMap") -> int:
        """Take `other`'s picks, with their candidate timings, at the points this map holds none: a map of
        some M buckets, modes or shapes profiled on this GPU then runs the rest as a GPU of its
        architecture measured them, instead of the nearest bucket's or shape's pick or the rules.
        Returns how many points it took; this map's own points are never replaced."""
        taken = 0
        for key, row in other.entries.items():
            for b, c in zip(other.buckets, row):
                if c is None or b not in self.buckets:
                    continue
                mine = self.entries.setdefault(key, [None] * len(self.buckets))
                i = self.buckets.index(b)
                if mine[i] is not None:
                    continue
                mine[i] = c
                timed = other.timings.get(key, {}).get(str(b))
                if timed and str(b) not in self.timings.get(key, {}):
                    self.timings.setdefault(key, {})[str(b)] = dict(timed)
                taken += 1
        return taken

    def without(self, strategy: str) -> "PolicyMap":
        """The map rebuilt from the stored timings with one strategy removed (an ablation)."""
        out = PolicyMap(self.device, self.buckets, meta=dict(self.meta), timings=self.timings)
        for key, per_m in self.timings.items():
            for m, cands in per_m.items():
                best = None
                for cand, us in cands.items():
                    name, cfg = parse_candidate(cand)
                    if name == strategy or us is None:
                        continue
                    if best is None or us < best.us:
                        best = Choice(name, cfg, us)
                if best is not None and int(m) in self.buckets:
                    out.set(key, int(m), best)
        return out


def candidate_name(strategy: str, cfg: TileConfig | None) -> str:
    return strategy if cfg is None else f"{strategy}@{json.dumps(cfg.to_dict(), sort_keys=True)}"


def parse_candidate(name: str) -> tuple[str, TileConfig | None]:
    if "@" not in name:
        return name, None
    s, c = name.split("@", 1)
    return s, TileConfig.from_dict(json.loads(c))


def cache_dir() -> Path:
    return Path(os.environ.get("GEARSHIFT_CACHE", Path.home() / ".cache" / "gearshift")) / "policy"


def triton_version() -> str | None:
    """The running Triton's version ("3.6.0"), or None without Triton."""
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def triton_release() -> str | None:
    """The running Triton's major.minor ("3.6"), or None without Triton. The same kernels compile
    to different machine code under another release, and the fastest tile can change with it: on
    the H100 the shipped map's W4A16 step at one token took 1.08x as long under Triton 3.9 as under
    3.6 (stop 38: two kernels got 74 registers instead of 92)."""
    v = triton_version()
    return None if v is None else ".".join(v.split(".")[:2])


def map_file_names(device: str, release: str | None = None) -> list[str]:
    """A GPU's map file names in preference order: the one profiled under `release` (default: the
    running Triton's; "" for none), `<device>.triton<major.minor>.json`, then `<device>.json`."""
    slug = device_slug(device)
    release = triton_release() if release is None else release
    return ([f"{slug}.triton{release}.json"] if release else []) + [f"{slug}.json"]


def policy_paths(device: str, model_dir: str | os.PathLike | None = None, release: str | None = None) -> list[Path]:
    """Where this GPU's map may be, in search order. At each place a map profiled under the running
    Triton release (`<device>.triton<major.minor>.json`) comes before the release-agnostic one."""
    names = map_file_names(device, release)
    paths = []
    if model_dir is not None:
        md = Path(model_dir)
        paths += [md / "policy" / n for n in names] + [md / f"policy_{n}" for n in names]
    paths += [cache_dir() / n for n in names]
    paths += [bundled_dir() / n for n in names]  # measured by the project on that GPU (Llama-3-8B shapes)
    return paths


def toolchain_note(pm: PolicyMap, release: str | None = None) -> str | None:
    """Why this map's timings may not hold here: it was profiled under another Triton release
    (None when the releases match or the map does not say)."""
    profiled = pm.meta.get("triton")
    release = triton_release() if release is None else release
    if not profiled or not release or ".".join(str(profiled).split(".")[:2]) == release:
        return None
    return (f"profiled with Triton {profiled}, this process runs Triton {release}: the same tiles compile "
            "differently and the fastest may change ('gearshift profile --seed auto' re-times them)")


def bundled_dir() -> Path:
    """Maps shipped with the package: profiled by the project on a lent GPU, winners only."""
    return Path(__file__).resolve().parents[1] / "data" / "policy"


def gpu_traits(index: int | None = None) -> dict:
    """What says whether a map profiled on another GPU fits this one: the compute capability (the
    kernels a map names compile and behave alike within one) and the SM count (tile grids and
    waves). The profiler stores both in a map's meta."""
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    return {"capability": f"{p.major}.{p.minor}", "sms": int(p.multi_processor_count)}


def load_policy_for_device(device: str | None = None, model_dir: str | os.PathLike | None = None,
                           traits: dict | None = None) -> PolicyMap | None:
    """The policy map profiled on this GPU (beside the model first, then the user cache, then the
    one shipped with the package for that GPU). Failing that, with `traits` (this GPU's
    `gpu_traits`, taken from the current device when `device` is too), the map of the nearest GPU
    of the same architecture (`same_architecture_map`; marked by `borrowed_for`), unless
    GEARSHIFT_POLICY_FALLBACK=0. Else None: the dispatcher's un-profiled rules run. A map of this GPU
    that lacks points (a profile of some M buckets or modes) takes them from that map too
    (`fill_missing`)."""
    if device is None:
        import torch

        if not torch.cuda.is_available():
            return None
        device = torch.cuda.get_device_name()
        traits = traits or gpu_traits()
    for p in map(resolve, policy_paths(device, model_dir)):  # NAME.json, or NAME.json.gz where only that exists
        if p.is_file():
            try:
                pm = PolicyMap.load(p)
            except (OSError, ValueError) as e:  # a damaged file must not stop the engine: the next place's map
                warnings.warn(f"skipping {e}", PolicyMapWarning, stacklevel=2)
                continue
            if pm.device == device:
                pm.path = str(p)  # where it came from, for reporting
                return fill_missing(pm, traits, model_dir)
    if traits is None or not fallback_on():
        return None
    pm = same_architecture_map(device, traits, model_dir)
    return pm if pm is None or pm.device != device else fill_missing(pm, traits, model_dir)


def fallback_on() -> bool:
    """Whether maps of other GPUs of the architecture may stand in (GEARSHIFT_POLICY_FALLBACK, default 1)."""
    return os.environ.get("GEARSHIFT_POLICY_FALLBACK", "1") != "0"


def filled_points(pm: PolicyMap) -> tuple[int, str] | None:
    """(points taken, the GPUs they come from) where `fill_missing` filled this map, else None."""
    filled = getattr(pm, "filled_from", None)
    if not filled:
        return None
    return sum(f["points"] for f in filled), " and ".join(dict.fromkeys(f["device"] for f in filled))


def load_map_file(path: str | os.PathLike) -> PolicyMap:
    """A map file named on a command line (a benchmark's --policy / --map), run as the engine would run
    it: a map of this very GPU that lacks points takes them from its architecture's maps
    (`fill_missing`), so the H200's shipped map, which holds only some points, is timed with the H100's for
    the rest and not with the built-in rules. Any other map (a what-if map of another GPU) is taken as it is."""
    pm = PolicyMap.load(path)
    pm.path = str(path)
    import torch

    if torch.cuda.is_available() and pm.device == torch.cuda.get_device_name():
        return fill_missing(pm, gpu_traits())
    return pm


def fill_missing(pm: PolicyMap, traits: dict | None, model_dir: str | os.PathLike | None = None) -> PolicyMap:
    """This GPU's own map, with the points it lacks taken from the maps of other GPUs of the same
    architecture, nearest first (`PolicyMap.fill_from`; recorded in `filled_from`). So profiling a few points
    here (`gearshift profile --m 4,8 --seed auto`) changes those points only, and a GPU whose shipped
    map holds only the points that it runs faster with its own picks keeps the rest of the borrowed
    map as that map is updated. Without `traits`, or with GEARSHIFT_POLICY_FALLBACK=0, the map is
    returned as it is."""
    if traits is None or not fallback_on():
        return pm
    filled = []
    for other in same_architecture_maps(pm.device, traits, model_dir, others_only=True):  # nearest GPU first
        taken = pm.fill_from(other)
        if taken:
            filled.append({"device": other.device, "path": other.path, "points": taken})
    if filled:
        pm.filled_from = filled
    return pm


def same_architecture_map(device: str, traits: dict, model_dir: str | os.PathLike | None = None) -> PolicyMap | None:
    """For a GPU nobody profiled: the map (beside the model, in the user cache, or shipped) profiled
    on a GPU of the same compute capability, the one with the nearest SM count first (ties: in that
    search order). Its kernels run here and compute the same as anywhere; only which tile is
    fastest may differ, which is far less than what the un-profiled rules give up (H200:
    benchmarks/results/policy_ab_*H200*). Maps without a recorded capability are never borrowed; a
    map of this very GPU saved under another file name is taken as its own. Between otherwise equal
    maps, the one profiled under the running Triton release wins."""
    maps = same_architecture_maps(device, traits, model_dir)
    return maps[0] if maps else None


def same_architecture_maps(device: str, traits: dict, model_dir: str | os.PathLike | None = None,
                           others_only: bool = False) -> list[PolicyMap]:
    """Every map `same_architecture_map` could take, best first (`others_only`: of other GPUs only),
    each with its `path` and, if another GPU profiled it, `borrowed_for`."""
    dirs = ([Path(model_dir) / "policy"] if model_dir is not None else []) + [cache_dir(), bundled_dir()]
    release = triton_release()
    ranked = []
    for order, d in enumerate(dirs):
        for p in sorted([*d.glob("*.json"), *d.glob("*.json.gz")]) if d.is_dir() else ():
            try:
                pm = PolicyMap.load(p)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):  # not a policy map: skip it
                continue
            cap, sms = pm.meta.get("capability"), pm.meta.get("sms")
            other_release = toolchain_note(pm, release) is not None  # a tie goes to this Triton's map
            if pm.device == device:  # this GPU's own map under another file name: no borrowing needed
                if others_only:
                    continue
                rank = (-1, other_release, order)
            elif cap is None or str(cap) != str(traits["capability"]):
                continue
            else:
                rank = (abs(int(sms) - int(traits["sms"])) if sms is not None else 1 << 30, other_release, order)
            pm.path = str(p)
            if pm.device != device:
                pm.borrowed_for = device
            ranked.append((rank, len(ranked), pm))  # equal ranks keep the search order
    return [pm for *_, pm in sorted(ranked, key=lambda r: r[:2])]


def nearest_shape_keys(keys, mode: str, group: int, n: int, k: int) -> list[str]:
    """The type keys among `keys` of this mode and group, nearest (N, K) first in log N + log K: whose
    picks or timings stand in for a shape nobody profiled (the tile configs are shape-agnostic; each
    use still checks that the kernel runs the store)."""
    near = []
    for key in keys:
        t = parse_type_key(key)
        if t is not None and t[:2] == (mode, group) and t[2] > 0 and t[3] > 0:
            near.append((abs(math.log2(t[2] / n)) + abs(math.log2(t[3] / k)), key))
    return [key for _, key in sorted(near)]


def unprofiled_shapes(pm: PolicyMap, shapes) -> list[tuple[int, int]]:
    """The (N, K) among `shapes` that no entry of the map covers, in any mode: the dispatcher runs
    the nearest profiled shape's picks for them."""
    have = {t[2:] for t in map(parse_type_key, pm.entries) if t is not None}
    return sorted({(int(n), int(k)) for n, k in shapes} - have)


def describe(pm: PolicyMap | None) -> str:
    """One line on which map the dispatcher runs, for `gearshift` notes and load info."""
    if pm is None:
        return "built-in rules (no policy map for this GPU: run 'gearshift profile')"
    where = getattr(pm, "path", "given")
    borrowed = getattr(pm, "borrowed_for", None)
    arch = f"sm_{str(pm.meta.get('capability', '')).replace('.', '')}"
    notes = []
    if borrowed is not None:
        notes.append(f"profiled on {pm.device}, same {arch} architecture as this {borrowed}: 'gearshift profile' "
                     "writes this GPU's own")
    filled = filled_points(pm)
    if filled:
        taken, on = filled
        notes.append(f"profiled on this GPU at {pm.points() - taken} of its {pm.points()} points, the others on "
                     f"{on}, same {arch} architecture")
    toolchain = toolchain_note(pm)
    if toolchain:
        notes.append(toolchain)
    return where + "".join(f" ({n})" for n in notes)
