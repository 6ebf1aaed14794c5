"""hybrid.train.distill.losses: stage 2's loss is the KL of teacher to student (plus the cross-entropy), by hand in
float64."""
import torch
import torch.nn.functional as F

from hybrid.train.distill import distill_loss, token_kl


def test_stage2_loss_is_the_kl_of_teacher_to_student_plus_ce():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 5, 11, generator=g, dtype=torch.float64)
    t = torch.randn(2, 5, 11, generator=g, dtype=torch.float64)
    y = torch.randint(0, 11, (2, 5), generator=g)
    tau, w = 2.0, 0.5
    loss, parts = distill_loss(s, t, y, temperature=tau, ce_weight=w)
    p_t = torch.softmax(t / tau, -1)
    kl = (p_t * (torch.log(p_t) - torch.log_softmax(s / tau, -1))).sum(-1).mean()  # by hand, float64
    ce = -torch.log_softmax(s, -1).gather(-1, y[..., None]).mean()
    torch.testing.assert_close(parts["kl"], kl, rtol=1e-12, atol=0)
    torch.testing.assert_close(loss, tau ** 2 * kl + w * ce, rtol=1e-12, atol=0)
    torch.testing.assert_close(token_kl(s, t, tau).mean(), kl, rtol=1e-12, atol=0)
    ref = F.kl_div(torch.log_softmax(s, -1).flatten(0, 1), torch.log_softmax(t, -1).flatten(0, 1), log_target=True,
                   reduction="batchmean")
    torch.testing.assert_close(distill_loss(s, t)[0], ref, rtol=1e-12, atol=0)
    assert distill_loss(s, t)[1]["ce"] is None
