"""`decode.sampling.sample_rows`: tokens drawn on the logits' device, batched over rows sharing their filters,
from exactly `filtered_logprobs`' distribution, each row from its own generator."""

import pytest
import torch

from gearshift.decode.sampling import SamplingParams, apply_penalties, filtered_logprobs, sample_rows

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0])


def _frequencies(params: SamplingParams, draws: int = 6000, seed: int = 1) -> torch.Tensor:
    g = SamplingParams(temperature=1.0, seed=seed).make_generator()
    counts = torch.zeros(len(LOGITS))
    for _ in range(draws // 200):  # 200 rows a call, one generator: the rows' draws are independent
        for t in sample_rows(LOGITS.expand(200, -1), [params] * 200, [g] * 200):
            counts[t] += 1
    return counts / counts.sum()


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.6),
                                    SamplingParams(temperature=1.3, top_k=3),
                                    SamplingParams(temperature=1.0, top_p=0.8),
                                    SamplingParams(temperature=1.0, min_p=0.2),
                                    SamplingParams(temperature=0.9, top_k=4, top_p=0.9, min_p=0.05)])
def test_draws_follow_the_filtered_distribution(params):
    want = filtered_logprobs(LOGITS, params).exp()
    got = _frequencies(params)
    assert (got[want == 0] == 0).all()  # filtered tokens are never drawn
    assert 0.5 * (got - want).abs().sum() < 0.03  # total variation, 6000 draws


def test_rows_with_other_filters_in_one_call():
    greedyish = SamplingParams(temperature=1.0, top_k=1)  # only the argmax survives
    wide = SamplingParams(temperature=5.0, seed=4)
    gens = [greedyish.make_generator(), wide.make_generator(), None]
    rows = [sample_rows(torch.stack([LOGITS, LOGITS, LOGITS.flip(0)]), [greedyish, wide, SamplingParams()], gens)
            for _ in range(200)]
    assert {r[0] for r in rows} == {0} and {r[2] for r in rows} == {5}  # top-k 1, and a plain greedy row
    assert len({r[1] for r in rows}) >= 4  # the hot row spreads over the vocabulary


def test_a_rows_draws_do_not_depend_on_the_rows_beside_it():
    p = SamplingParams(temperature=1.0, seed=9)
    other = SamplingParams(temperature=0.7, top_p=0.9, seed=2)

    def draws(batch):
        g = p.make_generator()
        gens = [g] + [other.make_generator() for _ in batch]
        return [sample_rows(torch.stack([LOGITS, *batch]), [p] + [other] * len(batch), gens)[0] for _ in range(30)]

    assert draws([]) == draws([LOGITS.flip(0), LOGITS * 2]) == draws([LOGITS])


def test_penalized_rows_sample_from_the_penalized_logits():
    p = SamplingParams(temperature=1.0, top_k=1, logit_bias={5: 100.0})  # the bias makes token 5 the only one
    q = SamplingParams(repetition_penalty=3.0)  # greedy, penalized: the argmax of the penalized logits
    hist = [([0], [1]), ([0, 1], [])]
    out = sample_rows(torch.stack([LOGITS, LOGITS]), [p, q], [p.make_generator(), None], hist)
    assert out[0] == 5 and out[1] == int(apply_penalties(LOGITS, q, *hist[1]).argmax())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA's generators"))])
def test_the_batched_draw_is_torch_multinomials(device):
    """draw_rows takes multinomial's one-sample draw without its host-side check: the same tokens, row by row,
    from the same generator states (here on a Llama-3-sized vocabulary)."""
    from gearshift.decode.sampling import draw_rows

    lp = torch.log_softmax(3 * torch.randn(6, 128256, generator=torch.Generator().manual_seed(0)), -1).to(device)
    for seed in range(5):
        gens = [torch.Generator(device).manual_seed(seed * 10 + j) for j in range(6)]
        want = [int(torch.multinomial(lp[j].exp(), 1, generator=g)) for j, g in enumerate(gens)]
        gens = [torch.Generator(device).manual_seed(seed * 10 + j) for j in range(6)]
        assert draw_rows(lp.exp(), gens).tolist() == want


def test_seeded_rows_repeat():
    p = SamplingParams(temperature=1.0, seed=5)
    a = [sample_rows(LOGITS[None], [p], [g])[0] for g in [p.make_generator()] for _ in range(20)]
    b = [sample_rows(LOGITS[None], [p], [g])[0] for g in [p.make_generator()] for _ in range(20)]
    assert a == b


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device path's generators")
def test_on_the_gpu_with_device_generators():
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=3)
    z = LOGITS.cuda().expand(4, -1).contiguous()
    a = sample_rows(z, [p] * 4, [p.make_generator("cuda") for _ in range(4)])
    b = sample_rows(z, [p] * 4, [p.make_generator("cuda") for _ in range(4)])
    keep = set(torch.isfinite(filtered_logprobs(LOGITS, p)).nonzero().flatten().tolist())
    assert a == b and set(a) <= keep
    cpu_gen = sample_rows(z, [p] * 4, [p.make_generator() for _ in range(4)])  # a CPU generator still works
    assert set(cpu_gen) <= keep


def test_policies_name_where_their_generators_live(tiny_int4):
    """The engine's sampler and GEARBX's Gumbel noise draw on the model's device, so their requests get generators
    there; QSPEC's acceptance draws on the host and keeps CPU generators."""
    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.decode.gearbox import GearboxPolicy
    from gearshift.decode.per_request_mode import PerRequestModePolicy
    from gearshift.decode.qspec import QSpecPolicy

    m = tiny_int4.model
    assert AutoregressivePolicy(m, "w4a16").sample_device == m.device
    assert PerRequestModePolicy(m, ["w4a16", "w4a8"], "w4a16").sample_device == m.device
    assert QSpecPolicy(m, "w4a8", "w4a16").sample_device.type == "cpu"
    assert GearboxPolicy(m, gears="high").sample_device == m.device
    assert SamplingParams(temperature=1.0, seed=1).make_generator(m.device).device == m.device


def test_rows_filtered_together_are_each_rows_own_filter():
    from gearshift.decode.sampling import filtered_logprobs_rows

    z = torch.randn(5, 3, 40)
    ps = [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.2, top_k=5),
          SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0, min_p=0.1),
          SamplingParams(temperature=1.2, top_k=5)]
    got = filtered_logprobs_rows(z, ps)
    for j, p in enumerate(ps):
        assert torch.equal(got[j], filtered_logprobs(z[j], p))
    assert torch.equal(filtered_logprobs_rows(z, [ps[0]] * 5), filtered_logprobs(z, ps[0]))


def test_rows_are_taken_as_a_view_where_consecutive():
    from gearshift.decode.sampling import put_rows, take_rows

    t = torch.arange(12.0).view(6, 2)
    assert take_rows(t, [2, 3, 4]).data_ptr() == t[2].data_ptr() and torch.equal(take_rows(t, [2, 3, 4]), t[2:5])
    assert torch.equal(take_rows(t, [4, 1]), t[[4, 1]])
    put_rows(t, [1, 2], torch.zeros(2, 2))
    put_rows(t, [5, 0], torch.ones(2, 2))
    assert t[:, 0].tolist() == [1, 0, 0, 6, 8, 1]
