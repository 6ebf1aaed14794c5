"""Hugging Face tooling for run directories (optional extras ``hf`` and ``eval``):

    hybrid-export RUN_DIR OUT_DIR        a run → a save_pretrained directory (AutoModelForCausalLM, tokenizer)
    hybrid-import HF_DIR OUT_DIR         a Llama / Mistral / Qwen2 checkpoint → a transformer-preset run directory
    hybrid-eval RUN_OR_HF_DIR --tasks …  lm-evaluation-harness on our model

Nothing here is imported by ``hybrid.train``; transformers and lm-eval are imported when these are used.
"""
