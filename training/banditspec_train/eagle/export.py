"""An EAGLE-3 head as an upstream-style checkpoint (``LlamaForCausalLMEagle3``: the layout vLLM,
SGLang and TensorRT-LLM read), for ``engine_build/eagle/export_eagle3.py``. Parameter names
already follow upstream (:mod:`banditspec.eagle.head3`); this adds ``d2t`` / ``t2d`` and the config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from banditspec.eagle.head3 import Eagle3Head


def export_upstream(head: Eagle3Head, target_config: Any, out_dir: Path) -> Path:
    """Write the head as an upstream-style EAGLE-3 checkpoint folder (model.safetensors +
    config.json): tensors ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``,
    ``d2t`` (int64 [K], target id = d + d2t[d]) and ``t2d`` (bool [V]); config keys of a
    ``LlamaForCausalLMEagle3``. Returns the folder."""
    from safetensors.torch import save_file

    c = head.config
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()
             if k != "draft_vocab"}
    vocab = head.draft_vocab.to(torch.int64)
    state["d2t"] = (vocab - torch.arange(len(vocab))).contiguous()
    t2d = torch.zeros(c.target_vocab_size, dtype=torch.bool)
    t2d[vocab] = True
    state["t2d"] = t2d
    save_file(state, str(out_dir / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.target_vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "max_position_embeddings": int(getattr(target_config, "max_position_embeddings", 8192)),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        # vLLM / speculators numbering: id j = the input of decoder layer j (output of layer j - 1).
        # TensorRT-LLM numbers by the layer whose OUTPUT it captures (Eagle3DecodingConfig
        # eagle3_layers_to_capture), i.e. aux_layers as they are; its default is these for 30 layers.
        "eagle_aux_hidden_state_layer_ids": [a + 1 for a in c.aux_layers],
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
