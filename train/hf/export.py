"""Run directory → save_pretrained directory.

    export_run("runs/demo", "hf/demo")      # model.safetensors, config.json, tokenizer.json, remote-code shims

``AutoModelForCausalLM.from_pretrained("hf/demo")`` (after ``import hybrid.models.hf``, or with
``trust_remote_code=True``) then gives the run's logits; ``AutoTokenizer.from_pretrained("hf/demo")`` its token ids.
"""
from __future__ import annotations

from pathlib import Path

from ..lm.inference import LoadedRun, load_run
from ..output.outdir import check_output_dir, staged_output_dir
from .tokenizer import to_hf_tokenizer


def hf_model_from_run(run: LoadedRun):
    """A ``HybridForCausalLM`` holding the run's weights (same device, eval mode) and its generation ids."""
    from hybrid.models.hf import HybridForCausalLM, HybridHFConfig

    tok = run.tokenizer
    bos = tok.document_start[0] if tok.document_start else None  # documents start from eos here (tokenizer.py)
    config = HybridHFConfig(run.model.config, bos_token_id=bos, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    model = HybridForCausalLM(config)
    model.model.load_state_dict(run.model.state_dict())
    model.to(run.model.embed.weight.device).eval()
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = tok.eos_id
    model.generation_config.pad_token_id = tok.pad_id
    if run.model.config.vocab_size > tok.vocab_size:  # the embedding's rows past the tokenizer's ids: never sampled
        model.generation_config.suppress_tokens = list(range(tok.vocab_size, run.model.config.vocab_size))
    return model


def export_run(run_dir, out_dir, *, overwrite: bool = False) -> Path:
    """Write the run's model and tokenizer as a transformers directory; returns ``out_dir``.

    An ``out_dir`` that exists and is not empty (a run directory, an earlier export) is refused unless
    ``overwrite``; it is then replaced whole, and a failed export changes nothing (``hybrid.train.output.outdir``).
    """
    out = Path(out_dir)
    check_output_dir(out, overwrite=overwrite, inputs=[("run_dir", run_dir)])
    run = load_run(run_dir)
    with staged_output_dir(out, overwrite=overwrite, inputs=[("run_dir", run_dir)], command="hybrid-export") as stage:
        hf_model_from_run(run).save_pretrained(stage)
        to_hf_tokenizer(run.tokenizer).save_pretrained(stage)
    return out
