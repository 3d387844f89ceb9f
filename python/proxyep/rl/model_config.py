"""The tiny MoE policy's shape, shared by the trainer, the rollout workers and the tests, so all
of them build the same model: TinyMoELM's initialisation depends only on these values (model.py:
every parameter from the seed), so policy version 0 is identical everywhere with no transfer.

A :class:`ModelConfig` travels as JSON (``to_json``/``from_json``, a file or an inline string:
``load``), e.g. the worker's ``--model-config``. ``build_ep_model`` gives the expert-parallel
model over a group and a deep_ep Buffer, ``build_dense_reference`` its single-process dense twin
(all experts), ``local_expert_state`` a rank's share of a full state dict (what a weight update
for that rank holds).
"""

import dataclasses
import json
import os

from .coordinator.protocol import RLError


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    hidden: int = 128  # a multiple of 128 for the low-latency exchange (bf16 rows)
    layers: int = 2
    heads: int = 4
    num_experts: int = 4
    topk: int = 2
    ffn_hidden: int = 32
    max_seq: int = 32  # prompt + generated tokens of one sample, at most
    seed: int = 0
    tie_embeddings: bool = False
    score: str = "softmax"
    aux_loss_coef: float = 0.0

    def validate(self):
        """Refuses a shape the model or the low-latency exchange cannot run, before anything is
        built (RLError naming the field)."""
        for name in ("vocab", "hidden", "layers", "heads", "num_experts", "topk", "ffn_hidden", "max_seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RLError(f"model config: {name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise RLError(f"model config: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.hidden % 128:
            raise RLError(f"model config: hidden {self.hidden} must be a multiple of 128 (low-latency exchange)")
        if self.topk > self.num_experts:
            raise RLError(f"model config: topk {self.topk} exceeds num_experts {self.num_experts}")
        if self.score not in ("softmax", "sigmoid"):
            raise RLError(f"model config: score must be 'softmax' or 'sigmoid', got {self.score!r}")
        return self

    def model_kwargs(self):
        return dataclasses.asdict(self)

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict):
            raise RLError(f"model config: expected a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise RLError(f"model config: unknown fields {sorted(unknown)}")
        return cls(**d).validate()

    @classmethod
    def from_json(cls, text):
        try:
            d = json.loads(text)
        except ValueError as e:
            raise RLError(f"model config: not valid JSON: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, file_or_json):
        """From a path to a JSON file, or from the JSON text itself (starts with '{')."""
        return cls.from_json(json_argument(file_or_json, "model config"))


def json_argument(file_or_json, what):
    """The JSON text of a command-line argument that is either inline JSON (starts with '{') or
    a path to a file holding it; RLError naming ``what`` when it is neither."""
    if file_or_json.lstrip().startswith("{"):
        return file_or_json
    if not os.path.isfile(file_or_json):
        raise RLError(f"{what}: {file_or_json!r} is neither a file nor a JSON object")
    with open(file_or_json) as f:
        return f.read()


def build_ep_model(config, group, buffer):
    """The expert-parallel TinyMoELM over ``group`` (num_experts / group size experts here) with
    its MoE exchange through ``buffer`` (a deep_ep Buffer; one in low_latency_mode serves both
    the normal and the low-latency calls)."""
    from proxyep.moe.model import TinyMoELM

    config.validate()
    return TinyMoELM(group=group, buffer=buffer, **config.model_kwargs())


def build_a2a_model(config, group):
    """The baseline of ``bench rl``: the same model with every MoE exchange, decode included,
    through all_to_all_single on ``group`` (moe/a2a_exchange.py) instead of deep_ep; generation
    calls it exactly as it calls the low-latency path."""
    from proxyep.moe.a2a_exchange import AllToAllExchange
    from proxyep.moe.model import TinyMoELM

    class A2ADecodeLM(TinyMoELM):
        def _moe_low_latency(self, moe, y):
            return moe(y)[0]

    config.validate()
    return A2ADecodeLM(group=group, exchange=AllToAllExchange(group), **config.model_kwargs())


def build_dense_reference(config):
    """The dense single-process twin (every expert), with the same initial weights."""
    from proxyep.moe.reference_model import DenseTinyMoELM

    config.validate()
    kwargs = config.model_kwargs()
    return DenseTinyMoELM(**kwargs)


def expert_parameter_names(config):
    """Names of the parameters that are split over the EP ranks (expert rows on dim 0)."""
    return {f"moe.{i}.{w}" for i in range(config.layers) for w in ("fc1", "fc2")}


def local_expert_state(config, full_state, rank, world):
    """{name: tensor} for EP rank ``rank`` of ``world`` from a full state (dense reference
    names, all experts): dense tensors as they are, expert tensors cut to this rank's rows (the
    experts rank * E/world ...; the layout of MoELayer)."""
    if config.num_experts % world:
        raise RLError(f"num_experts {config.num_experts} is not a multiple of the EP size {world}")
    local = config.num_experts // world
    experts = expert_parameter_names(config)
    out = {}
    for name, value in full_state.items():
        if name in experts:
            if value.shape[0] != config.num_experts:
                raise RLError(f"{name}: {value.shape[0]} expert rows, expected {config.num_experts}")
            value = value[rank * local:(rank + 1) * local]
        out[name] = value
    return out
