"""GEARBX precision manager: physical gear shifts of the managed linear layers (paper section 6).

Gears (paper table 8): ``low`` = per-row int4 (:func:`quantize_rowwise` 4 bits -> ``Int4Weight``
with group = K, read packed by the w4a16 kernels), ``mid`` = per-row int8 (``Int8Weight``, read
by the w8a16 kernel), ``high`` = the layer's original store (dense fp16/bf16/fp32, or whatever
the checkpoint held: the embedded SmolLM2's original gear is its Q4_1 int4 store).

The swapped unit is the ``QuantLinear.store`` (a ``WeightFormat`` module holding buffers);
``QuantLinear.set_store`` is the paper's ``setattr`` on the parent: the pointer swap copies no
tensor data.  Run the model in precision mode ``"native"`` so every layer runs whatever store it
holds with 16-bit activations.

What happens on a shift (paper Listing 1):

* to a quantized gear: the gear's stores come from the gear cache (moved to the device if the
  cache lives on the host) or are quantized now from the originals (**lazy**: only that gear,
  only on first entry, paper 6.2); they are swapped into the tree; the originals (and the gear
  that was active before, if any) go to the **host pool**;
* to high: the originals come back from the host pool and are swapped in; the quantized gear
  that was active goes to the gear cache.

Host pool.  On CUDA every store that leaves the device gets a *pinned* host twin, created by
the first offload (one device->host copy) and kept: weights never change, so later offloads
of the same store only drop the device tensors (no copy) and a reload is one host->device copy
from pinned memory.  On CPU the "device" is the host: nothing is copied, the stores simply
leave the model tree and live in the manager (the very same tensor objects come back).

Gear cache location (``cache_device``): ``"host"`` (default, the paper's behaviour: at most one
quantized representation lives on the device, cached re-entry pays one host->device copy) or
``"device"`` (cached gears stay resident: re-entry is a pointer swap, device memory holds every
gear built so far).  ``offload_originals=False`` keeps the originals resident as well: the
dispatch-style configuration the split batch rule uses (see ``decode/gearbox.py``).

Memory is reported from the tensors themselves (``WeightFormat.nbytes``, ``data_ptr`` /
``device`` of each buffer), never from formulas.
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass, field

import torch

from gearshift.decode.entropy import GEARS
from gearshift.kernels.reference import drop_dequant_cache
from gearshift.quant.base import WeightFormat
from gearshift.quant.detect import DoubleQuantizationWarning, prequant_report
from gearshift.quant.rowwise import quantize_rowwise

#: weight bits of each quantized gear (paper table 8); "high" is the original store
GEAR_QUANT_BITS: dict[str, int] = {"low": 4, "mid": 8}
#: paper 6.1: attention components matched in the lower-cased, underscore-free module path
ATTENTION_COMPONENTS = ("selfattention", "selfattn", "attention", "attn")
#: MLP components (our extension for --manage mlp / attention+mlp)
MLP_COMPONENTS = ("mlp", "feedforward", "ffn")
MANAGE_CHOICES = ("attention", "mlp", "attention+mlp")


@dataclass
class ShiftRecord:
    """One physical shift (or pre-warm) and what it cost."""

    src: str
    dst: str
    kind: str  # "quantize" (first entry), "cached" (re-entry), "high" (originals back), "prewarm"
    seconds: float
    bytes_to_device: int = 0
    bytes_to_host: int = 0
    quantized_layers: int = 0

    def as_dict(self) -> dict:
        return {"from": self.src, "to": self.dst, "kind": self.kind, "seconds": round(self.seconds, 6),
                "bytes_to_device": self.bytes_to_device, "bytes_to_host": self.bytes_to_host,
                "quantized_layers": self.quantized_layers}


@dataclass
class ManagedLayer:
    name: str
    prefix: str  # the container path (paper 6.1 step 3), e.g. "model.layers.0.self_attn"
    layer_index: int
    module: object  # the QuantLinear
    original: WeightFormat
    stores: dict = field(default_factory=dict)  # gear -> WeightFormat (quantized gears)


def _norm(component: str) -> str:
    return component.lower().replace("_", "")


def discover(model: torch.nn.Module, manage: str = "attention") -> list[tuple[str, str, int, object]]:
    """Paper 6.1 module discovery, model-agnostic: (name, container prefix, layer index, module).

    Walks ``named_modules()``, keeps the linear layers (modules with a swappable weight store:
    ``QuantLinear``) whose dot-separated path has a component that, lower-cased and without
    underscores, contains an attention word (``self_attn``, ``attention``, ``attn``,
    ``selfattention``) -- and, with ``manage`` including "mlp", an MLP word (``mlp``,
    ``feed_forward``, ``ffn``).  The prefix is the path up to that container; the result is
    sorted (stably) by the first integer component (the layer index), so swapping order is
    deterministic.  The lm_head and embeddings never match."""
    if manage not in MANAGE_CHOICES:
        raise ValueError(f"manage must be one of {', '.join(MANAGE_CHOICES)}, not {manage!r}")
    words = (ATTENTION_COMPONENTS if "attention" in manage else ()) + (MLP_COMPONENTS if "mlp" in manage else ())
    found = []
    for name, mod in model.named_modules():
        if not (hasattr(mod, "set_store") and isinstance(getattr(mod, "store", None), WeightFormat)):
            continue
        parts = name.split(".")
        for j, comp in enumerate(parts[:-1]):
            c = _norm(comp)
            if any(w in c for w in words):
                ints = [int(p) for p in parts if re.fullmatch(r"\d+", p)]
                found.append((name, ".".join(parts[: j + 1]), ints[0] if ints else -1, mod))
                break
    found.sort(key=lambda t: t[2])  # stable: module-tree order within a layer
    return found


def _tensors(store: WeightFormat) -> list[torch.Tensor]:
    return [b for b in store.buffers()]


def store_device_bytes(store: WeightFormat, device: torch.device) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(store) if t.device == device)


class PrecisionManager:
    """Gear shifts of the managed layers of one model (module docstring)."""

    def __init__(self, model: torch.nn.Module, manage: str = "attention", *, offload_originals: bool = True,
                 cache_device: str = "host", pin_memory: bool | None = None, warn_double_quant: bool = True,
                 quantize_fn=quantize_rowwise):
        if cache_device not in ("host", "device"):
            raise ValueError("cache_device must be 'host' or 'device'")
        self.model = model
        self.manage = manage
        dev = getattr(model, "device", None)
        self.device = torch.device(dev) if dev is not None else next(model.buffers()).device
        self.cuda = self.device.type == "cuda"
        self.offload_originals = bool(offload_originals)
        self.cache_device = cache_device
        self.pin_memory = self.cuda if pin_memory is None else bool(pin_memory and self.cuda)
        self.warn_double_quant = warn_double_quant
        self.quantize_fn = quantize_fn
        self.layers = [ManagedLayer(n, p, i, m, m.store) for n, p, i, m in discover(model, manage)]
        if not self.layers:
            raise ValueError(f"no linear layers matched manage={manage!r}")
        self._on_host: set[int] = set()  # CPU only: ids of stores logically in the host pool
        self.gear = "high"
        self.history: list[ShiftRecord] = []
        #: quantize_fn calls (tests: the gear cache must not re-quantize)
        self.quantize_calls = 0
        #: managed-weight device bytes measured right after each gear became active
        self.gear_device_bytes: dict[str, int] = {"high": self.device_bytes()}
        self.prequantized: list[str] | None = None  # names flagged by the double-quantization check
        self._host_twins: dict[int, dict[str, torch.Tensor]] = {}  # id(buffer owner store) -> pinned twins

    # ---- introspection ------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [l.name for l in self.layers]

    @property
    def prefixes(self) -> list[str]:
        out = []
        for l in self.layers:
            if l.prefix not in out:
                out.append(l.prefix)
        return out

    def built_gears(self) -> list[str]:
        return [g for g in GEAR_QUANT_BITS if all(g in l.stores for l in self.layers)]

    def active_stores(self) -> list[WeightFormat]:
        return [l.module.store for l in self.layers]

    def _all_stores(self) -> list[WeightFormat]:
        out = []
        for l in self.layers:
            out.append(l.original)
            out.extend(l.stores.values())
        return out

    def device_bytes(self, gear: str | None = None) -> int:
        """Bytes of managed-weight tensors that live on the model's device, measured from the tensors.

        ``gear=None``: everything the manager holds there (active gear, resident originals,
        device-cached gears); a gear name: only that gear's stores (originals for "high").
        Shared storages are counted once."""
        stores = self._all_stores() if gear is None else self._gear_stores(gear)
        seen, total = set(), 0
        for st in stores:
            if id(st) in self._on_host:  # CPU: held in the host pool (device == host)
                continue
            for t in _tensors(st):
                if t.device == self.device and t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
        return total

    def host_bytes(self) -> int:
        """Bytes the host pool holds (pinned twins on CUDA; managed stores held off-tree on CPU)."""
        if self.cuda:
            return sum(t.numel() * t.element_size() for tw in self._host_twins.values() for t in tw.values())
        return sum(s.nbytes() for s in self._all_stores() if id(s) in self._on_host)

    def gear_nbytes(self, gear: str) -> int | None:
        """Bytes of one gear's managed stores wherever they are (None if not built yet)."""
        if gear != "high" and gear not in self.built_gears():
            return None
        return sum(s.nbytes() for s in self._gear_stores(gear))

    def _gear_stores(self, gear: str) -> list[WeightFormat]:
        if gear == "high":
            return [l.original for l in self.layers]
        return [l.stores[gear] for l in self.layers if gear in l.stores]

    # ---- moving stores -----------------------------------------------------------------------
    def _to_host(self, store: WeightFormat) -> int:
        """Move a store's buffers to the host pool; returns bytes copied (0 when the twin exists)."""
        drop_dequant_cache(store)
        if not self.cuda:
            self._on_host.add(id(store))
            return 0
        twins = self._host_twins.setdefault(id(store), {})
        copied = 0
        for name, buf in list(store._buffers.items()):
            if buf is None or buf.device.type == "cpu":
                continue
            tw = twins.get(name)
            if tw is None or tw.shape != buf.shape or tw.dtype != buf.dtype:
                tw = torch.empty(buf.shape, dtype=buf.dtype, device="cpu", pin_memory=self.pin_memory)
                tw.copy_(buf, non_blocking=self.pin_memory)
                twins[name] = tw
                copied += buf.numel() * buf.element_size()
            store._buffers[name] = tw
        return copied

    def _to_device(self, store: WeightFormat) -> int:
        """Move a store's buffers (host twins) to the model device; returns bytes copied."""
        if not self.cuda:
            self._on_host.discard(id(store))
            return 0
        copied = 0
        for name, buf in list(store._buffers.items()):
            if buf is None or buf.device == self.device:
                continue
            store._buffers[name] = buf.to(self.device, non_blocking=self.pin_memory)
            copied += buf.numel() * buf.element_size()
        return copied

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # ---- quantization ------------------------------------------------------------------------
    def _source_weight(self, layer: ManagedLayer) -> torch.Tensor:
        """The original weight as a dense tensor on the device (the quantizer's input)."""
        st = layer.original
        if st.format_name == "dense":
            w = st.weight  # keep the source dtype: it selects the scale floor (paper 5.1)
        else:
            w = st.dequantize(torch.float32)
        return w.to(self.device, non_blocking=self.pin_memory) if w.device != self.device else w

    def _check_double_quantization(self) -> None:
        if self.prequantized is not None:
            return
        flagged = []
        for l in self.layers:
            st = l.original
            w = st.weight if st.format_name == "dense" else st.dequantize(torch.float32)
            rep = prequant_report(w)
            if rep.flagged:
                flagged.append((l.name, rep.reason))
        self.prequantized = [n for n, _ in flagged]
        if flagged and self.warn_double_quant:
            warnings.warn(f"{len(flagged)} of {len(self.layers)} managed layers look already quantized "
                          f"({flagged[0][0]}: {flagged[0][1]}); the low/mid gears re-quantize them and the errors "
                          "compound (GEARBX 13.3), most of all in the int4 low gear",
                          DoubleQuantizationWarning, stacklevel=3)

    def _build(self, gear: str, place: str) -> int:
        """Quantize every managed layer for ``gear``; stores land on the device or the host."""
        self._check_double_quantization()
        bits = GEAR_QUANT_BITS[gear]
        n = 0
        for l in self.layers:
            if gear in l.stores:
                continue
            st = self.quantize_fn(self._source_weight(l), bits)
            self.quantize_calls += 1
            n += 1
            l.stores[gear] = st
            if place == "host":
                self._to_host(st)
        return n

    # ---- shifting ----------------------------------------------------------------------------
    def _swap_in(self, gear: str) -> None:
        for l in self.layers:
            l.module.set_store(l.original if gear == "high" else l.stores[gear])

    def shift(self, target: str) -> ShiftRecord | None:
        """Make ``target`` the active gear of every managed layer (paper Listing 1).

        Returns the record of what it did and cost (None when already in ``target``)."""
        if target not in GEARS:
            raise ValueError(f"unknown gear {target!r}")
        src = self.gear
        if target == src:
            return None
        self._sync()
        t0 = time.perf_counter()
        to_dev = to_host = nq = 0
        if target == "high":
            kind = "high"
            for l in self.layers:
                to_dev += self._to_device(l.original)
            self._swap_in("high")
            if self.cache_device == "host":
                for l in self.layers:
                    to_host += self._to_host(l.stores[src])
        else:
            cached = all(target in l.stores for l in self.layers)
            kind = "cached" if cached else "quantize"
            if not cached:
                nq = self._build(target, "device")
            for l in self.layers:
                to_dev += self._to_device(l.stores[target])
            self._swap_in(target)
            if src == "high":
                if self.offload_originals:
                    for l in self.layers:
                        to_host += self._to_host(l.original)
            elif self.cache_device == "host":
                for l in self.layers:
                    to_host += self._to_host(l.stores[src])
        self.gear = target
        self._sync()
        rec = ShiftRecord(src, target, kind, time.perf_counter() - t0, to_dev, to_host, nq)
        self.history.append(rec)
        self.gear_device_bytes[target] = self.device_bytes()
        return rec

    def prewarm(self, gear: str) -> ShiftRecord | None:
        """Build ``gear`` ahead of a predicted shift (paper 3.5) without activating it.

        The stores go where the cache lives (host or device).  No-op for high or a built gear."""
        if gear == "high" or gear == self.gear or gear in self.built_gears():
            return None
        self._sync()
        t0 = time.perf_counter()
        nq = self._build(gear, self.cache_device)
        self._sync()
        rec = ShiftRecord(self.gear, gear, "prewarm", time.perf_counter() - t0, 0, 0, nq)
        self.history.append(rec)
        return rec

    def restore(self) -> None:
        """Back to high gear (the unmodified model)."""
        self.shift("high")

    def clear_cache(self) -> None:
        """Forget every quantized gear that is not active (frees their memory)."""
        for l in self.layers:
            for g in list(l.stores):
                if g != self.gear:
                    st = l.stores.pop(g)
                    self._host_twins.pop(id(st), None)
                    self._on_host.discard(id(st))

    # ---- telemetry ---------------------------------------------------------------------------
    def stats(self) -> dict:
        by_kind: dict[str, dict] = {}
        for r in self.history:
            k = by_kind.setdefault(r.kind, {"count": 0, "seconds": 0.0})
            k["count"] += 1
            k["seconds"] += r.seconds
        for k in by_kind.values():
            k["seconds"] = round(k["seconds"], 6)
        shifts = [r for r in self.history if r.kind != "prewarm"]
        return {
            "managed": self.manage,
            "managed_layers": len(self.layers),
            "managed_prefixes": len(self.prefixes),
            "current_gear": self.gear,
            "shift_count": len(shifts),
            "shift_cost_s": round(sum(r.seconds for r in shifts), 6),
            "prewarm_cost_s": round(sum(r.seconds for r in self.history if r.kind == "prewarm"), 6),
            "shift_cost_by_kind": by_kind,
            "quantize_calls": self.quantize_calls,
            "managed_device_bytes_by_gear": dict(self.gear_device_bytes),
            "managed_gear_nbytes": {g: self.gear_nbytes(g) for g in GEARS},
            "host_pool_bytes": self.host_bytes(),
            "offload_originals": self.offload_originals,
            "cache_device": self.cache_device,
            "double_quantized_layers": None if self.prequantized is None else len(self.prequantized),
        }
