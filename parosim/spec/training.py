"""Training configuration and the mixed-precision byte constants.

Defaults are the PaRO paper's setting (docs/model.md, "The paper's setting"): micro-batch
4, 10 accumulation micro-steps, sequence length 512, full training.

>>> t = TrainingSpec()
>>> t.micro_batch, t.accum_steps, t.seq_len, t.trainable_ratio
(4, 10, 512, 1.0)
>>> TrainingSpec(trainable_ratio=parse_trainable_ratio("partial")).trainable_ratio
0.0625
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from ..errors import InputError

# Mixed-precision Adam (docs/model.md, "Memory per GPU"; Rajbhandari et al. 2020, ZeRO):
BYTES_PER_PARAM = 2        # bf16/fp16 parameters, all Ψ (frozen ones too)
BYTES_PER_GRAD = 2         # bf16/fp16 gradients, trainable Ψ' only
BYTES_PER_OPTIM_STATE = 12  # fp32 master weights + Adam m + Adam v, trainable Ψ' only
BYTES_PER_ACTIVATION = 2   # fp16/bf16 activations (Korthikanti et al. 2022 count in these)
# FP8 training (Transformer Engine style, docs/compute.md "FP8"): the bf16 parameters, fp32
# master weights and Adam states above stay; each decoder-layer GEMM weight is also cached in
# fp8 (1 byte) with its fp8 transpose (1 byte), refreshed once per optimizer step.
FP8_WEIGHT_CACHE_BYTES_PER_PARAM = 2
# Optimizer-state precisions (``TrainingSpec.optimizer_dtype``, docs/memory.md "Optimizer
# states"): "fp32" = the 12 bytes above; "bf16" = Apex ``DistributedFusedAdam`` with
# ``dtype=bf16`` as NeMo sets it up (``setup_optimization`` in NVIDIA/NeMo
# ``nemo/collections/nlp/models/language_modeling/megatron_base_model.py``): Adam m and v in
# bf16 (2 + 2 bytes) and no master copy when the parameters are bf16 too (``store_params =
# False``), a bf16 master copy (2 bytes) when the GEMM weights are fp8 (``fp8_params``:
# ``store_params = True``).
OPTIMIZER_DTYPES = ("fp32", "bf16")
BF16_ADAM_STATE_BYTES = 4
BF16_MASTER_BYTES = 2

# Training precisions: "bf16" (mixed precision, every GEMM in bf16) or "fp8" (decoder-layer
# weight GEMMs on the FP8 tensor cores; attention and the LM head stay bf16).
PRECISIONS = ("bf16", "fp8")

# Named trainable ratios Ψ'/Ψ (docs/model.md, "Symbols"):
TRAINABLE_RATIOS: dict[str, float] = {"full": 1.0, "partial": 1 / 16, "peft": 3 / 1000}

# Dense LLM training reaches roughly 40-60% of peak FLOPS (docs/model.md, "Compute and
# hardware figures"); we take the middle. It applies to matmul time, not to memory-bound work.
DEFAULT_COMPUTE_EFFICIENCY = 0.5
# What the memory settings left unset (None) mean without a runtime profile (the ideal
# runtime): Korthikanti et al. 2022's estimate with eager attention, as before profiles.
DEFAULT_ATTENTION = "eager"
DEFAULT_MEMORY_MODEL = "korthikanti"

# Model fidelity (docs/accuracy.md, "Defaults"): "accurate" (the default of every command)
# fills each modelling setting left unset with the most accurate model parosim has, as
# measured against published runs: the kernel compute model, FlashAttention, memory as
# PyTorch frameworks keep it (bf16 logits with their fp32 upcast, allocator margin) and NCCL's
# tuner for the collectives the runtime does not fix. "paper": the PaRO paper's closed-form
# setting (flat efficiency, eager attention, the Korthikanti estimate with fp32 logits,
# HO-Ring), the defaults before fidelities existed. Settings given explicitly win in both.
FIDELITIES = ("accurate", "paper")
DEFAULT_FIDELITY = "accurate"
ACCURATE_SETTINGS = {"compute_model": "kernel", "attention": "flash",
                     "memory_model": "runtime"}
# Bytes per logit live at the loss under "accurate": a fused bf16 cross-entropy (logits 2 +
# their gradient 2) and a training metric over the same logits (2), as the published
# llm-foundry runs keep them; fitted on the even half of its 61 runs, checked on the odd half
# (experiments/08_memory/check_memory.py --fit-logit-bytes; runtimes/fsdp.yaml). PyTorch's
# unfused F.cross_entropy keeps 10 (--logit-bytes 10).
ACCURATE_LOGIT_BYTES = 6
# Allocator margin of the Korthikanti memory estimate (TP / PP / CP / selective layouts, and
# ``memory_model = "korthikanti"``) under "accurate", a fraction of states + activations +
# buffers: fitted one-sided on the even rows of the published tables whose runs take that
# path (Narayanan, Korthikanti, BigScience, torchtitan 405B and its fleet's 70B benchmark,
# NeMo / Megatron-Bridge FP8): the largest fraction, in 0.5 % steps, under which every
# fit-row run still fits; odd rows held out (experiments/08_memory/fit_korthikanti_margin.py,
# docs/memory.md). "paper" keeps the former 10 % (parosim.cost.memory.MARGIN_FRACTION).
KORTHIKANTI_MARGIN_FRACTION = 0.105
ACCURATE_ALGO = "nccl"      # collective algorithm of the ideal runtime under "accurate"
PAPER_ALGO = "ho-ring"


def check_fidelity(fidelity: str, where: str = "--fidelity") -> str:
    """``fidelity`` if known, else one clear line.

    >>> check_fidelity("paper")
    'paper'
    """
    if fidelity not in FIDELITIES:
        raise InputError(f"{where} {fidelity!r} is not known; expected "
                         f"{' or '.join(FIDELITIES)}")
    return fidelity


def for_fidelity(training: TrainingSpec, fidelity: str, runtime=None,
                 layered: bool = False, cluster=None) -> TrainingSpec:
    """``training`` with the settings it leaves unset (None) filled in as ``fidelity`` says.

    "paper" returns it unchanged (the runtime profile and the cluster decide, as before).
    "accurate" sets an unset compute model to kernel, an unset ``korthikanti_margin`` to the
    fitted :data:`KORTHIKANTI_MARGIN_FRACTION` and, unless a runtime profile other
    than the ideal one states how its framework keeps memory (deepspeed, fsdp, paro:
    runtimes/*.yaml), an unset attention to flash and memory model to runtime. ``layered``
    (tensor / pipeline / context parallelism or selective recomputation): the memory model
    stays the Korthikanti estimate, the only one those layouts have (docs/parallelism.md).
    A ``cluster`` whose YAML states ``compute.model`` keeps its compute model.

    >>> t = for_fidelity(TrainingSpec(), "accurate")
    >>> t.compute_model, t.attention, t.memory_model, t.logit_bytes, t.korthikanti_margin
    ('kernel', 'flash', 'runtime', 6, 0.105)
    >>> for_fidelity(TrainingSpec(attention="eager"), "accurate").attention
    'eager'
    >>> for_fidelity(TrainingSpec(), "paper") == TrainingSpec()
    True
    """
    check_fidelity(fidelity, "fidelity")
    if fidelity == "paper":
        return training
    own = runtime is not None and runtime.name != "ideal"
    keys = ("compute_model",) if own else ("compute_model", "attention") if layered \
        else tuple(ACCURATE_SETTINGS)
    if cluster is not None and getattr(cluster.compute, "model_given", False):
        keys = tuple(k for k in keys if k != "compute_model")   # the YAML's own choice
    out = replace(training, **{k: getattr(training, k) or ACCURATE_SETTINGS[k] for k in keys})
    if training.korthikanti_margin is None:   # the fitted margin wherever that estimate runs
        out = replace(out, korthikanti_margin=KORTHIKANTI_MARGIN_FRACTION)
    if "memory_model" in keys and training.memory_model is None and \
            training.logit_bytes is None:
        out = replace(out, logit_bytes=ACCURATE_LOGIT_BYTES)
    return out


def parse_trainable_ratio(value: str | float | int) -> float:
    """Ψ'/Ψ from ``"full"`` (1), ``"partial"`` (1/16), ``"peft"`` (3/1000), a number in
    (0, 1], or a fraction ``"1/16"``.

    >>> parse_trainable_ratio("peft"), parse_trainable_ratio("1/16"), parse_trainable_ratio(0.5)
    (0.003, 0.0625, 0.5)
    """
    if isinstance(value, bool):
        raise InputError(f"trainable ratio {value!r} is not a ratio; expected "
                         f"{', '.join(TRAINABLE_RATIOS)} or a number in (0, 1]")
    if isinstance(value, (int, float)):
        r = float(value)
    else:
        text = str(value).strip().lower()
        if text in TRAINABLE_RATIOS:
            return TRAINABLE_RATIOS[text]
        m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*(?:/\s*([0-9.eE+-]+))?\s*", text)
        try:
            r = float(m.group(1)) / (float(m.group(2)) if m.group(2) else 1.0)
        except (AttributeError, ValueError, ZeroDivisionError):
            raise InputError(f"trainable ratio {value!r} is not known; expected "
                             f"{', '.join(TRAINABLE_RATIOS)}, a number in (0, 1] or a "
                             "fraction like '1/16'") from None
    _check_ratio(r, value)
    return r


def _check_ratio(r: float, shown: object) -> None:
    if not (math.isfinite(r) and 0 < r <= 1):
        raise InputError(f"trainable ratio {shown!r} must be in (0, 1] (the fraction of "
                         "parameters that are trained)")


def _pos_int(v: object, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"{name} = {v!r} must be a positive integer")


@dataclass(frozen=True)
class TrainingSpec:
    """How one global step is run.

    ``micro_batch``: sequences per GPU per micro-step (b). ``accum_steps``: gradient
    accumulation micro-steps per global step (s). ``seq_len``: tokens per sequence.
    ``trainable_ratio``: Ψ'/Ψ in (0, 1].

    ``recompute``: full activation recomputation. ``None`` (the default) means *auto*: on
    exactly when the configuration would not fit in GPU memory without it (resolved by
    :func:`parosim.cost.memory.resolve_recompute`). This reproduces the paper's choice (LLaMA-65B
    on, LLaMA-7B off) from a rule instead of a size threshold, and never pays the extra
    forward when memory allows.

    ``compute_efficiency``: fraction of the GPU's peak FLOP/s that matmuls achieve; default
    0.5, the middle of the 40-60% MFU that dense training reaches (docs/model.md).

    ``overlap_slowdown`` (>= 1): compute advances at 1/f of its speed while a collective
    runs beside it (NCCL kernels take SMs and HBM bandwidth from the matmuls; exact fluid
    model in the engine and the analytic mode). ``None`` (the default): the cluster YAML's
    ``compute.overlap_slowdown`` if it sets one, else the runtime profile's default (1.0 for
    the ideal runtime; the measured 1.189 for deepspeed / fsdp / paro, see
    docs/runtimes.md). A number overrides both.

    ``compute_model``: ``"flat"`` or ``"kernel"`` (:mod:`parosim.cost.kernels`); ``None`` (the
    default) takes the cluster's ``compute.model`` (itself ``"flat"`` unless the cluster YAML
    says otherwise).

    ``attention``: ``"eager"`` (scores materialised, as Korthikanti et al. 2022 count them
    and as HuggingFace LLaMA ran in 2023) or ``"flash"`` (FlashAttention / PyTorch SDPA: the
    s x s scores are never stored). It sets activation memory (:mod:`parosim.cost.memory`) and,
    under the kernel compute model, the attention kernels' time. ``None`` (the default): the
    runtime profile's (``runtimes/*.yaml``: eager for ideal, deepspeed, paro; flash for
    fsdp), :data:`DEFAULT_ATTENTION` without one.

    ``memory_model``: ``"korthikanti"`` (Korthikanti et al. 2022 eq. 1, fp32 logits,
    ``korthikanti_margin`` + 1 GiB margin) or ``"runtime"`` (activations as PyTorch runtimes
    keep them, itemised per saved tensor; logits in the precision the framework keeps;
    fitted allocator margin; see :mod:`parosim.cost.memory`). ``None`` (the default): the
    runtime profile's (korthikanti for ideal, runtime for deepspeed / fsdp / paro),
    :data:`DEFAULT_MEMORY_MODEL` without one.
    ``logit_bytes``: bytes per logit live at the loss; ``None`` = the runtime profile's, else
    the memory model's own (4: fp32 logits for korthikanti; 10 for runtime: bf16 logits, an
    fp32 upcast and the fp32 log-softmax); 2 for a fused bf16 cross-entropy that writes its
    gradient in place (flash-attn's ``CrossEntropyLoss``). :meth:`with_defaults` fills the
    three in (:func:`parosim.spec.runtime.training_for_runtime` from a profile).

    >>> TrainingSpec(micro_batch=2).tokens_per_micro_step
    1024
    """

    micro_batch: int = 4
    accum_steps: int = 10
    seq_len: int = 512
    trainable_ratio: float = 1.0
    recompute: bool | None = None
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    overlap_slowdown: float | None = None
    compute_model: str | None = None
    attention: str | None = None
    memory_model: str | None = None
    logit_bytes: int | None = None
    precision: str = "bf16"
    # Memory only (parosim.cost.fp8mem, docs/memory.md "FP8"): Megatron's ``hidden_dropout`` (the
    # residual-branch dropout after the o-projection and after the MLP; its 1-byte masks are
    # kept for backward when > 0). None: counted as Korthikanti et al. 2022 count it (two
    # masks per layer in the Korthikanti estimate, none in the runtime model).
    hidden_dropout: float | None = None
    # precision fp8 only: decoder-layer GEMM weights stored in fp8 (Megatron
    # ``--fp8-param-gather``, Transformer Engine ``fp8_model_init``): 1 byte per weight and no
    # bf16 copy; Transformer Engine caches the fp8 transpose (1 byte) beside it.
    fp8_params: bool = False
    # Memory only (docs/memory.md "Optimizer states"): the optimizer's state precision, "fp32"
    # (fp32 master weights + Adam m, v: 12 bytes per trainable parameter) or "bf16" (NeMo's
    # Apex distributed Adam with ``optim.dtype: bf16``: 4 bytes, 6 with ``fp8_params``).
    optimizer_dtype: str = "fp32"
    # Memory only: the allocator margin of the Korthikanti estimate, a fraction of model states
    # + activations + buffers (plus the 1 GiB runtime reserve). None: 0.10, the paper
    # fidelity's (parosim.cost.memory.MARGIN_FRACTION, a choice); ``--fidelity accurate``
    # sets the fitted KORTHIKANTI_MARGIN_FRACTION. The runtime memory model has its own
    # fitted fraction (FRAGMENTATION_FRACTION) and does not read this one.
    korthikanti_margin: float | None = None

    def __post_init__(self) -> None:
        _pos_int(self.micro_batch, "micro_batch")
        _pos_int(self.accum_steps, "accum_steps")
        _pos_int(self.seq_len, "seq_len")
        if isinstance(self.trainable_ratio, bool) or not isinstance(self.trainable_ratio,
                                                                    (int, float)):
            raise InputError(f"trainable_ratio = {self.trainable_ratio!r} must be a number in "
                             "(0, 1]; use parse_trainable_ratio for names like 'peft'")
        _check_ratio(float(self.trainable_ratio), self.trainable_ratio)
        object.__setattr__(self, "trainable_ratio", float(self.trainable_ratio))
        if self.recompute is not None and not isinstance(self.recompute, bool):
            raise InputError(f"recompute = {self.recompute!r} must be true, false or None "
                             "(auto)")
        e = self.compute_efficiency
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 < e <= 1:
            raise InputError(f"compute_efficiency = {e!r} must be a fraction in (0, 1] of "
                             "peak FLOP/s")
        o = self.overlap_slowdown
        if o is not None and (isinstance(o, bool) or not isinstance(o, (int, float)) or not (
                math.isfinite(o) and o >= 1)):
            raise InputError(f"overlap_slowdown = {o!r} must be a factor >= 1")
        if self.compute_model not in (None, "flat", "kernel"):
            raise InputError(f"compute_model = {self.compute_model!r} is not known; expected "
                             "flat or kernel (or None: the cluster's)")
        if self.attention not in (None, "flash", "eager"):
            raise InputError(f"attention = {self.attention!r} is not known; expected flash or "
                             "eager (or None: the runtime profile's)")
        lb = self.logit_bytes
        if lb is not None and (isinstance(lb, bool) or not isinstance(lb, int)
                               or not 2 <= lb <= 16):
            raise InputError(f"logit_bytes = {self.logit_bytes!r} must be an integer from 2 "
                             "(fused bf16 cross-entropy) to 16")
        if self.precision not in PRECISIONS:
            raise InputError(f"precision = {self.precision!r} is not known; expected "
                             f"{' or '.join(PRECISIONS)}")
        d = self.hidden_dropout
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float))
                              or not 0 <= d < 1):
            raise InputError(f"hidden_dropout = {d!r} must be a probability in [0, 1) (or None:"
                             " as Korthikanti et al. count it)")
        if not isinstance(self.fp8_params, bool):
            raise InputError(f"fp8_params = {self.fp8_params!r} must be true or false")
        if self.fp8_params and self.precision != "fp8":
            raise InputError("fp8_params = True stores the GEMM weights in fp8; expected "
                             "precision = 'fp8' with it")
        if self.optimizer_dtype not in OPTIMIZER_DTYPES:
            raise InputError(f"optimizer_dtype = {self.optimizer_dtype!r} is not known; "
                             f"expected {' or '.join(OPTIMIZER_DTYPES)}")
        k = self.korthikanti_margin
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, float))
                              or not 0 <= k < 1):
            raise InputError(f"korthikanti_margin = {k!r} must be a fraction in [0, 1) of the "
                             "allocated bytes (or None: the paper fidelity's 0.10)")
        if self.memory_model not in (None, "runtime", "korthikanti"):
            raise InputError(f"memory_model = {self.memory_model!r} is not known; expected "
                             "runtime or korthikanti (or None: the runtime profile's)")

    @property
    def tokens_per_micro_step(self) -> int:
        """Tokens one GPU processes per micro-step: b x seq_len."""
        return self.micro_batch * self.seq_len

    @property
    def tokens_per_gpu_step(self) -> int:
        """Tokens one GPU processes per global step: b x seq_len x s."""
        return self.micro_batch * self.seq_len * self.accum_steps

    def with_defaults(self, attention: str = DEFAULT_ATTENTION,
                      memory_model: str = DEFAULT_MEMORY_MODEL,
                      logit_bytes: int | None = None) -> TrainingSpec:
        """This spec with its unset (None) memory settings filled in; set ones are kept.

        >>> t = TrainingSpec(attention="flash").with_defaults()
        >>> t.attention, t.memory_model, t.logit_bytes
        ('flash', 'korthikanti', None)
        """
        if self.attention is not None and self.memory_model is not None and (
                self.logit_bytes is not None or logit_bytes is None):
            return self
        return replace(self, attention=self.attention or attention,
                       memory_model=self.memory_model or memory_model,
                       logit_bytes=(self.logit_bytes if self.logit_bytes is not None
                                    else logit_bytes))

    @property
    def optim_state_bytes(self) -> int:
        """Optimizer-state bytes per trainable parameter (``optimizer_dtype``): 12 for fp32
        (master weights, Adam m and v); for bf16 4 (m, v), plus a 2-byte bf16 master copy
        with ``fp8_params``.

        >>> TrainingSpec().optim_state_bytes, TrainingSpec(optimizer_dtype="bf16").optim_state_bytes
        (12, 4)
        >>> TrainingSpec(precision="fp8", fp8_params=True, optimizer_dtype="bf16").optim_state_bytes
        6
        """
        if self.optimizer_dtype == "fp32":
            return BYTES_PER_OPTIM_STATE
        return BF16_ADAM_STATE_BYTES + (BF16_MASTER_BYTES if self.fp8_params else 0)

    def with_micro_batch(self, b: int) -> TrainingSpec:
        return replace(self, micro_batch=b)

    def with_recompute(self, recompute: bool | None) -> TrainingSpec:
        return replace(self, recompute=recompute)


def accum_for_global_batch(text: str | int, micro_batch: int, data_parallel: int,
                           seq_len: int) -> int:
    """Accumulation steps s from a global batch, as DeepSpeed relates them:
    ``train_batch_size = micro_batch x s x data-parallel GPUs`` (sequences). ``text`` is a
    number of sequences (``2048``) or of tokens (``1Mitok`` = 2**20, ``4Mtok`` = 4e6,
    ``524288tokens``); a batch that is not a whole multiple is refused.

    >>> accum_for_global_batch("1280", 4, 32, 512), accum_for_global_batch("1Mitok", 4, 32, 512)
    (10, 16)
    """
    _pos_int(micro_batch, "micro_batch")
    _pos_int(data_parallel, "data-parallel GPUs")
    _pos_int(seq_len, "seq_len")
    raw = str(text).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKMGT]i?)?\s*"
                     r"(tok|toks|tokens?|seqs?|sequences?)?", raw)
    if not m or (m.group(2) and not m.group(3)):
        raise InputError(f"--global-batch {text!r} is not a batch size; expected sequences "
                         "(e.g. 2048) or tokens (e.g. 1Mitok, 4Mtok, 524288tokens)")
    scale = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10,
             "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2) or ""]
    value = float(m.group(1)) * scale
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise InputError(f"--global-batch {text!r} must be a positive whole number")
    value = int(value)
    tokens = (m.group(3) or "").startswith("tok")
    if tokens:
        if value % seq_len:
            raise InputError(f"--global-batch {text!r} = {value} tokens is not a whole number "
                             f"of {seq_len}-token sequences; expected a multiple of --seq-len")
        value //= seq_len
    per_step = micro_batch * data_parallel
    if value % per_step or value < per_step:
        lo = max(per_step, value // per_step * per_step)
        raise InputError(f"--global-batch {text!r} = {value} sequences is not a positive "
                         f"multiple of micro-batch x data-parallel GPUs = {micro_batch} x "
                         f"{data_parallel} = {per_step}; expected e.g. {lo} or {lo + per_step}"
                         " sequences")
    return value // per_step


RECOMPUTE_FLAGS = {"auto": None, "on": True, "off": False, "full": True, "none": False,
                   "selective": False}


def efficiency_model(compute_model: str | None, efficiency: float | None) -> str | None:
    """The compute model an ``--efficiency`` implies: an efficiency is the flat model's, so
    it selects it, and is refused beside ``--compute-model kernel``; without one, the
    ``compute_model`` given (None: unset).

    >>> efficiency_model(None, 0.4), efficiency_model("kernel", None)
    ('flat', 'kernel')
    """
    if efficiency is None:
        return compute_model
    if compute_model == "kernel":
        raise InputError(f"--efficiency {efficiency:g} applies to the flat compute model; got "
                         "--compute-model kernel (which costs each kernel from its shape); "
                         "expected one of them")
    return "flat"


def training_from_flags(a, gpus: int) -> TrainingSpec:
    """The :class:`TrainingSpec` of ``parosim simulate``'s flags (``a``: the parsed
    namespace, or any object with the same attributes, e.g. a sweep point read as flags) on
    ``gpus`` GPUs: ``--global-batch`` sets the accumulation (a different ``--accum`` given
    with it is refused), ``--efficiency`` selects the flat compute model (refused beside
    ``--compute-model kernel``)."""
    accum = a.accum
    if getattr(a, "global_batch", None) is not None:
        dp = (gpus // (getattr(a, "tp", None) or 1) // (getattr(a, "pp", None) or 1)
              // (getattr(a, "cp", None) or 1))
        accum = accum_for_global_batch(a.global_batch, a.micro_batch, dp, a.seq_len)
        if getattr(a, "_given_accum", False) and a.accum != accum:
            raise InputError(f"--accum {a.accum} disagrees with --global-batch "
                             f"{a.global_batch} (which gives accum {accum}); expected one "
                             "of them")
    compute_model = efficiency_model(a.compute_model, a.efficiency)
    return TrainingSpec(
        micro_batch=a.micro_batch, accum_steps=accum, seq_len=a.seq_len,
        trainable_ratio=parse_trainable_ratio(a.trainable_ratio),
        recompute=RECOMPUTE_FLAGS[a.recompute],
        compute_efficiency=(DEFAULT_COMPUTE_EFFICIENCY if a.efficiency is None
                            else a.efficiency),
        overlap_slowdown=a.overlap_slowdown, compute_model=compute_model,
        attention=a.attention, memory_model=a.memory_model, logit_bytes=a.logit_bytes,
        precision=getattr(a, "precision", "bf16"))
