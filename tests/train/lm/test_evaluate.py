"""The validation loss is scored as training scores it: a float64 model's in float64 (it was float32's, a rounding
of about 1e-7 in the loss), over exactly the validation windows."""
import torch
import torch.nn.functional as F

from hybrid.models import HybridConfig, HybridLM
from hybrid.train.data import prepare_data
from hybrid.train.lm.evaluate import evaluate


def test_a_float64_models_validation_loss_is_float64(corpus):
    data = prepare_data(str(corpus))
    torch.manual_seed(0)
    model = HybridLM(HybridConfig.preset("hybrid", "tiny", vocab_size=data.tokenizer.vocab_size, window=8)).double()
    got = evaluate(model, data, seq_len=24, batch_size=3, max_sequences=7)
    loss_sum, targets = 0.0, 0
    with torch.no_grad():
        for x, y in data.valid_batches(24, 3, max_sequences=7):
            logits, _ = model(x)
            loss_sum += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
            targets += y.numel()
    assert got["val_tokens"] == targets == 7 * 24
    assert abs(got["val_loss"] - loss_sum / targets) <= 1e-13 * loss_sum / targets
