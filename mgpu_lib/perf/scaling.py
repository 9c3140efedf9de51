"""How long a training step takes on N devices, DataParallel vs DDP: a model made of numbers.

A step is compute, communication and overhead, each a pure function of numbers (no torch, no
GPU); `evidence` fits what the datasheets cannot give (efficiency, DataParallel's Python)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DeviceSpec:
    """Peak figures of one accelerator (one die), from the vendor's datasheet, and the links
    between two of them in the machines they come in (keys of `LINKS`, see `pair_link`)."""
    name: str
    fp32_tflops: float
    tensor_tflops: Optional[float]   # dense tensor peak in `tensor_dtype`; None: no tensor cores
    tensor_dtype: Optional[str]      # "bf16", or "fp16" where the chip has no bf16
    mem_gbs: float                   # memory bandwidth, GB/s
    source: str
    tf32_tflops: Optional[float] = None   # dense TF32 tensor peak; None: no TF32 (before Ampere)
    link: str = "PCIe gen3 x16"      # between two of them where nothing else is known
    pcie: str = "PCIe gen3 x16"      # the PCIe generation the card speaks


@dataclass(frozen=True)
class LinkSpec:
    """What one device can send (and, at the same time, receive) to its neighbour."""
    name: str
    gbs: float          # GB/s per direction
    latency_s: float    # per message (one ring hop)
    source: str


NO_P2P = "PCIe, no P2P (staged through host)"
NVLINK_GBS = 25.0       # one NVLink (generations 2 to 4), per direction: see `LINKS`
NVLINK_SOURCE = ("NVIDIA DGX-1 with Tesla V100 System Architecture whitepaper (WP-08437-002): "
                 "six NVLinks per V100, each 25 GB/s in each direction; NVLink 3 (A100, 12 "
                 "links, 600 GB/s total) and NVLink 4 (H100, 18 links, 900 GB/s) keep 25 GB/s "
                 "per link and direction (A100 and H100 datasheets)")

DEVICES: dict[str, DeviceSpec] = {s.name: s for s in [
    DeviceSpec("K80 (one GK210 die)", 4.37, None, None, 240.0,
               "NVIDIA Tesla K80 datasheet: 8.73 TFLOP/s FP32 (GPU Boost), 480 GB/s, 24 GB per "
               "board of two GK210 dies; halved per die. Kepler has no tensor cores and no bf16"),
    DeviceSpec("T4", 8.1, 65.0, "fp16", 320.0,
               "NVIDIA T4 Tensor Core GPU datasheet: 8.1 TFLOP/s FP32, 65 TFLOP/s FP16 mixed "
               "precision, 320 GB/s, PCIe gen3 x16. Turing has no bf16 and no TF32"),
    DeviceSpec("V100 SXM2", 15.7, 125.0, "fp16", 900.0,
               "NVIDIA Tesla V100 datasheet (SXM2): 15.7 TFLOP/s FP32, 125 TFLOP/s tensor "
               "(FP16), 900 GB/s HBM2. Volta has no bf16 and no TF32",
               link="NVLink 2, 1 link (V100 pair)"),
    DeviceSpec("A100 SXM4 80GB", 19.5, 312.0, "bf16", 2039.0,
               "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): 19.5 TFLOP/s FP32, "
               "156 TFLOP/s TF32 tensor (312 with sparsity), 312 TFLOP/s BF16 tensor (dense), "
               "2,039 GB/s HBM2e, PCIe gen4", tf32_tflops=156.0,
               link="NVLink 3 (A100, NVSwitch)", pcie="PCIe gen4 x16"),
    # Hopper: the H200 is an H100 with more and faster memory (the two datasheets).
    *(DeviceSpec(f"{chip} {form}", 67.0, 989.0, "bf16", gbs,
                 f"NVIDIA {chip} Tensor Core GPU datasheet ({form}): 67 TFLOP/s FP32, 989 "
                 "TFLOP/s TF32 tensor with sparsity (494.5 dense), 1,979 TFLOP/s BF16 tensor "
                 f"with sparsity (989 dense), {memory}, PCIe gen5", tf32_tflops=494.5,
                 link="NVLink 4 (H100/H200, NVSwitch)", pcie="PCIe gen5 x16")
      for chip, form, gbs, memory in (("H100", "SXM5", 3350.0, "3.35 TB/s HBM3"),
                                      ("H200", "SXM", 4800.0, "4.8 TB/s HBM3e"))),
    DeviceSpec("RTX 4090", 82.6, 165.2, "bf16", 1008.0,
               "NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090): 82.6 TFLOP/s "
               "FP32, 82.6 TFLOP/s TF32 tensor (165.2 with sparsity), 165.2 TFLOP/s BF16 "
               "tensor (dense, FP32 accumulate), 1,008 GB/s GDDR6X, PCIe gen4",
               tf32_tflops=82.6, link=NO_P2P, pcie="PCIe gen4 x16"),
]}

LINKS: dict[str, LinkSpec] = {s.name: s for s in [
    LinkSpec("PCIe gen3 x16", 16.0, 5e-6,
             "PCI Express 3.0 specification: 8 GT/s x 16 lanes, 128b/130b = 15.75 GB/s per "
             "direction (~16)"),
    LinkSpec("PCIe gen4 x16", 32.0, 5e-6,
             "PCI Express 4.0 specification: 16 GT/s x 16 lanes = 31.5 GB/s per direction (~32)"),
    LinkSpec("PCIe gen5 x16", 64.0, 5e-6,
             "PCI Express 5.0 specification: 32 GT/s x 16 lanes = 63 GB/s per direction (~64)"),
    # A DGX-1's V100s are a hybrid cube-mesh: a linked pair shares 1 or 2 of a GPU's 6 NVLinks
    # (GPU0-GPU3 share two: `pair_link(spec, topo="NV2")`). d2l's builds do not print which 2
    # V100s a notebook saw: one link (GPUs 0 and 1) is assumed.
    LinkSpec("NVLink 2, 1 link (V100 pair)", NVLINK_GBS, 2e-6,
             NVLINK_SOURCE + "; hybrid cube-mesh: GPU0-GPU1 share one link (nvidia-smi topo -m "
             "on an 8-V100 SXM2 server: NV1), assumed for d2l's builds"),
    # NVSwitch gives every pair a GPU's full NVLink bandwidth (HGX A100 8-GPU, DGX H100).
    LinkSpec("NVLink 3 (A100, NVSwitch)", 300.0, 2e-6,
             "NVIDIA A100 datasheet: NVLink 600 GB/s total, i.e. 300 GB/s per direction, to "
             "any GPU through NVSwitch (HGX A100 8-GPU)"),
    LinkSpec("NVLink 4 (H100/H200, NVSwitch)", 450.0, 2e-6,
             "NVIDIA H100/H200 datasheets: NVLink 900 GB/s total, i.e. 450 GB/s per direction, "
             "to any GPU through NVSwitch (DGX H100: nvidia-smi topo -m shows NV18)"),
    # GeForce RTX 40 cards have P2P disabled: every GPU-to-GPU byte is staged through host
    # memory, where NCCL's collectives reach far less than the wire.
    LinkSpec(NO_P2P, 2.0, 20e-6,
             "d2l-neu's build machine, 4x RTX 4090 without P2P (github.com/smolix/d2l-neu, "
             "chapter_computational-performance/hardware.md): a large GPU-to-GPU copy ~20 GB/s, "
             "NCCL 'a couple of GB/s of effective bus bandwidth' on the staged path"),
]}


def pair_link(spec: DeviceSpec, p2p: Optional[bool] = None, topo: Optional[str] = None) -> LinkSpec:
    """The link between two GPUs of `spec`: `p2p` False stages every copy through host memory;
    a `nvidia-smi topo -m` code NV# is # NVLinks, any other a PCIe path at the card's
    generation. Without either, the machines' own link (`spec.link`)."""
    if p2p is False:
        return LINKS[NO_P2P]
    if topo and topo.startswith("NV") and topo[2:].isdigit():
        n = int(topo[2:])
        return LinkSpec(f"NVLink x{n} ({topo})", n * NVLINK_GBS, 2e-6, NVLINK_SOURCE)
    if topo or (p2p and spec.link == NO_P2P):
        return LINKS[spec.pcie]
    return LINKS[spec.link]


def conv_peak_tflops(spec: DeviceSpec) -> float:
    """The peak the chapter's "fp32" convolutions run at on `spec`.

    On Ampere and newer GPUs (A100, RTX 30 and 40, H100, H200) cuDNN runs fp32
    convolutions in TF32 on the tensor cores: `torch.backends.cudnn.allow_tf32` is True
    by default (PyTorch's note "TensorFloat-32 (TF32) on Ampere (and later) devices"),
    and the fast loop turns on TF32 for matmuls too. Their peak is the datasheet's dense
    TF32 figure, not the FP32 cores'. Before Ampere (K80, T4, V100) there is no TF32, and
    the FP32 cores do the work. The final linear layer is a few thousand FLOPs per image
    out of about a billion, whatever its precision.
    """
    return spec.tf32_tflops or spec.fp32_tflops


# words a device name may carry beside the datasheet's: the vendor, the brand, the memory type
_NOISE = {"NVIDIA", "TESLA", "GEFORCE", "HBM2", "HBM2E", "HBM3", "HBM3E"}


def _words(name: str) -> set:
    return set(re.split(r"[\s_\-]+", name.upper().replace("...", " "))) - _NOISE - {""}


def spec_for_name(name: str) -> Optional[DeviceSpec]:
    """The datasheet of the device `name` (as torch.cuda.get_device_name or a published run
    gives it), matched by whole words after normalizing: the chip must be the datasheet's ("RTX
    A1000" is no A100, "T400" no T4, "RTX" alone no chip), and a form factor or memory size the
    name states must be the datasheet's ("A100-SXM4-40GB" is not the 80 GB one, "H100 PCIe" not
    the SXM5). None: a device this book has no figures for. The one datasheet lookup."""
    if name in DEVICES:                          # a datasheet's own name
        return DEVICES[name]
    words = _words(name)
    for spec in DEVICES.values():
        key = _words(spec.name.split(" (")[0])
        chip = next(w for w in spec.name.upper().split() if any(c.isdigit() for c in w))
        sizes = {w for w in key if w.endswith("GB")}
        if chip in words and words - {w for w in words if w.endswith("GB") and not sizes} <= key:
            return spec
    return None


@dataclass(frozen=True)
class Workload:
    """The model being trained, as numbers. Defaults: the chapter's ResNet-18 (width 64)."""
    params: int = 11_175_818
    forward_flops: float = 0.9116e9     # per 28x28 image (mgpu_lib.perf.flops.resnet18_flops)
    train_factor: float = 3.0           # forward + backward ~ 3 x forward
    bytes_per_param: int = 4            # fp32 gradients
    input_bytes: int = 28 * 28 * 4      # one float32 image
    output_bytes: int = 10 * 4          # ten float32 logits
    tensors: int = 127                  # parameters (76) and buffers (51) `replicate` copies

    @property
    def train_flops(self) -> float:
        return self.train_factor * self.forward_flops

    @property
    def grad_bytes(self) -> float:
        return self.params * self.bytes_per_param


RESNET18 = Workload()


@dataclass(frozen=True)
class Overheads:
    """Per-step costs that are not FLOPs or link traffic. Assumptions, stated and adjustable."""
    efficiency: float = 0.4      # achieved FLOP/s at a large batch (FLOPs as `FlopCounterMode`
                                 # counts them) over `conv_peak_tflops`; not utilization:
                                 # cuDNN's Winograd kernels do fewer operations, so it can pass 1
    half_batch: float = 16.0     # per-device batch that reaches half that rate (small kernels
                                 # leave SMs idle): compute = (batch + half_batch) / rate
    step_s: float = 2e-3         # launching ~200 kernels per step at ~10 us each
    thread_s: float = 2e-3       # DataParallel's Python thread per device and step, under the
                                 # GIL; `evidence.fit` fits it (this default is the old guess)
    tensor_s: float = 17e-6      # DataParallel, per device, step and tensor `replicate` copies
                                 # (measured: 2.16 ms for the chapter's 127, 2-core AMD EPYC)
    overlap: float = 0.5         # DDP: share of backward time that can hide the all-reduce
    optimizer_passes: float = 3  # SGD reads params and grads, writes params: 3 x bytes / mem BW


# Seconds per image of the chapter's loader (d2l's: PIL and `ToTensor` per image, 4 worker
# processes), at 28 px and at 64 px (`Resize(64)` first), one core: `tools/time_loader.py`
# (batch 256, no workers, best of 3), re-timed with the current code on a 2-core AMD EPYC
# (AVX2) in issue 51: 105 and 162 us. The constant it replaced (227 us at 28 px) did not
# reproduce; an AVX-512 EPYC of the same class measured 45 to 47 us, so a CPU's model moves it
# 2x either way, and the time model's loader cap is a range's middle, not a datasheet.
CHAPTER_LOADER_S = {28: 105e-6, 64: 162e-6}
D2L_LOADER_WORKERS = 4


def loader_rate(image_size: int = 28, workers: int = D2L_LOADER_WORKERS) -> float:
    """Images per second the chapter's loader delivers with `workers` processes, a core each."""
    return workers / CHAPTER_LOADER_S[image_size]


@dataclass(frozen=True)
class StepTime:
    """One step split into parts (seconds). `communication` is what is NOT hidden by backward."""
    compute: float
    communication: float
    overhead: float
    hidden: float = 0.0          # communication that overlapped with backward (not in total)

    @property
    def total(self) -> float:
        return self.compute + self.communication + self.overhead


def ring_allreduce_s(nbytes: float, n: int, gbs: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce: each device sends and receives 2(n-1)/n of the data in 2(n-1) hops."""
    return 2 * (n - 1) / n * nbytes / (gbs * 1e9) + 2 * (n - 1) * latency_s if n > 1 else 0.0


def ring_allreduce_steps(n: int) -> list[tuple[str, list[list[int]]]]:
    """A ring all-reduce over `n` ranks, step by step: after each step, how many ranks'
    gradients rank r's copy of chunk c sums (`counts[r][c]`). n - 1 reduce-scatter steps, then
    n - 1 all-gather steps; in each, every rank sends one chunk to its right-hand neighbour."""
    counts = [[1] * n for _ in range(n)]
    steps = [("start", [row[:] for row in counts])]
    for phase, chunk_of in (("reduce-scatter", lambda i, s: (i - s) % n),
                            ("all-gather", lambda i, s: (i + 1 - s) % n)):
        for s in range(n - 1):
            sent = [(i, chunk_of(i, s), counts[i][chunk_of(i, s)]) for i in range(n)]
            for i, c, k in sent:   # all sends happen at once: read first, then write
                dest = counts[(i + 1) % n]
                dest[c] = dest[c] + k if phase == "reduce-scatter" else k
            steps.append((f"{phase} {s + 1}", [row[:] for row in counts]))
    return steps


def allreduce_bytes(num_params: int, n: int, bytes_per_param: int = 4) -> dict[str, float]:
    """Bytes one step sends over the busiest device's link, each way: DDP's ring sends 2(n-1)/n
    of the gradients per rank; DataParallel's pipelined broadcast and reduce carry about one
    copy each way over GPU 0's link, whatever n is."""
    size = num_params * bytes_per_param
    return {"ddp_ring_per_device": 2 * (n - 1) / n * size,
            "dp_gpu0": float(size) if n > 1 else 0.0}


def dp_comm_s(w: Workload, n: int, per_device: float, link: LinkSpec) -> float:
    """DataParallel's traffic through device 0's link, never overlapped: broadcast weights,
    reduce gradients (about one copy each), scatter inputs and gather outputs."""
    if n <= 1:
        return 0.0
    bw = link.gbs * 1e9
    collectives = 2 * (w.grad_bytes / bw + (n - 1) * link.latency_s)
    return collectives + (n - 1) * per_device * (w.input_bytes + w.output_bytes) / bw


def dp_python_s(w: Workload, n: int, o: Overheads) -> float:
    """DataParallel's Python every step: per device, `replicate` copies each parameter and
    buffer tensor into a new module tree, and a thread launches that replica's forward."""
    return n * (o.thread_s + w.tensors * o.tensor_s) if n > 1 else 0.0


def compute_rate(spec: DeviceSpec, w: Workload, efficiency: float) -> float:
    """Images/s one device trains at `efficiency` (vs counted FLOPs) of `conv_peak_tflops`."""
    return conv_peak_tflops(spec) * 1e12 * efficiency / w.train_flops


def predict_step_time(n_devices: int, global_batch: float, spec: DeviceSpec, link: LinkSpec,
                      strategy: str = "ddp", *, workload: Workload = RESNET18,
                      overheads: Overheads = Overheads()) -> StepTime:
    """Seconds for one training step of `global_batch` images on `n_devices` devices, with
    `strategy` "ddp" (the ring all-reduce, partly hidden by backward) or "dp" (DataParallel)."""
    w, o = workload, overheads
    per_device = global_batch / n_devices
    compute = (per_device + o.half_batch) / compute_rate(spec, w, o.efficiency)
    optimizer = o.optimizer_passes * w.grad_bytes / (spec.mem_gbs * 1e9)
    if strategy == "ddp":
        raw = ring_allreduce_s(w.grad_bytes, n_devices, link.gbs, link.latency_s)
        backward = compute * (w.train_factor - 1) / w.train_factor
        hidden = min(raw, o.overlap * backward)
        return StepTime(compute, raw - hidden, o.step_s + optimizer, hidden)
    return StepTime(compute, dp_comm_s(w, n_devices, per_device, link),
                    o.step_s + optimizer + dp_python_s(w, n_devices, o))


def predict_epoch_time(n_devices: int, global_batch: int, num_images: int, spec: DeviceSpec,
                       link: LinkSpec, strategy: str = "ddp", *,
                       loader_images_per_s: Optional[float] = None, **kw) -> float:
    """Seconds per epoch: ceil(images / global batch) steps (the last one may be short). The
    loader works while the GPUs train, so its rate (images/s) bounds the epoch, never adds."""
    full, rest = divmod(num_images, global_batch)
    t = full * predict_step_time(n_devices, global_batch, spec, link, strategy, **kw).total
    if rest:
        t += predict_step_time(n_devices, rest, spec, link, strategy, **kw).total
    return max(t, num_images / loader_images_per_s) if loader_images_per_s else t


