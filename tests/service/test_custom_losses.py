"""Server-side custom losses: graphs the real SDK traces and encodes run here as the Python function they came
from (value, gradient, metrics), inside an engine ``LossFn`` with its scaling; and what a graph may not do is
refused at creation with a line naming it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

from rlflow.engines import LossContext
from rlflow.service.batches import Datum, training_batch
from rlflow.service.catalogue import UnknownModelError
from rlflow.service.custom_loss_graph import MAX_NODES, CustomLossError
from rlflow.service.custom_losses import CustomLossStore, custom_loss_fn, request_metrics

SESSION, ACCOUNT = "s0-abc", "acct-1"


def clipped_surrogate(logprobs, old, advantages, scale):
    ratio = torch.exp(logprobs - old)
    loss = -torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).sum() * scale
    return loss, {"custom/ratio:mean": ratio.mean(), "custom/clipped:sum": (ratio > 1.2).float().sum()}


def shapes_and_functions(logprobs, weights):
    n = logprobs.shape[0]
    tail = logprobs[1:] * weights[1:]
    loss = -(tail.sum() / n) + 0.1 * F.logsigmoid(logprobs).mean() - torch.where(weights > 0, logprobs, 0.0).sum()
    return loss, {"custom/n:sum": torch.zeros_like(logprobs).sum() + n}


LOSSES = {"clipped_surrogate": (clipped_surrogate, {"logprobs": 1, "old": 1, "advantages": 1, "scale": 0}),
          "shapes_and_functions": (shapes_and_functions, {"logprobs": 1, "weights": 1})}


def _body(fn, ranks) -> dict:
    handle = trace_loss(fn, ranks, SESSION)
    return {"name": handle.name, "inputs": [item.model_dump() for item in handle.inputs],
            "graph": encode_graph(handle).model_dump(mode="json")}


def _datum(ranks: dict, n: int, generator: torch.Generator) -> tuple[Datum, list[torch.Tensor]]:
    tokens = torch.randint(0, 50, (n + 1,), generator=generator).tolist()
    values = {name: torch.randn((n,) if rank else (), generator=generator) for name, rank in ranks.items() if name != "logprobs"}
    inputs = {"target_tokens": tokens[1:], **{name: value.reshape(-1).tolist() for name, value in values.items()}}
    return Datum(tokens[:-1], inputs), list(values.values())


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("dp_size,micro_batches", [(1, 1), (2, 3)])
def test_an_uploaded_loss_runs_as_the_function_it_was_traced_from(name, dp_size, micro_batches):
    fn, ranks = LOSSES[name]
    store = CustomLossStore()
    loss = store.get({"loss_id": store.create(_body(fn, ranks), SESSION, ACCOUNT)}, SESSION, ACCOUNT)
    generator = torch.Generator().manual_seed(0)
    data, values = zip(*(_datum(ranks, n, generator) for n in (5, 3, 6)))
    batch = training_batch(list(data), dict(loss.inputs[1:]), pad_token_id=0, max_len=64, vocab_size=50)
    log_probs = (-torch.rand(batch.batch["input_ids"].shape, generator=generator) * 2).requires_grad_()
    ctx = LossContext(global_num_tokens=14, global_num_seqs=3, dp_size=dp_size, num_micro_batches=micro_batches,
                      micro_batch_index=0)
    total, metrics = custom_loss_fn(loss)({"log_probs": log_probs}, batch, ctx)
    (grad,) = torch.autograd.grad(total, log_probs)

    reference_lp = log_probs.detach().clone().requires_grad_()
    reference, sums = 0, {}
    for row, (datum, inputs) in enumerate(zip(data, values)):  # the Python function itself, datum by datum
        value, datum_metrics = fn(reference_lp[row, 1 : len(datum.tokens) + 1], *inputs)
        reference = reference + value
        for key, metric in datum_metrics.items():
            sums[key] = sums.get(key, 0.0) + float(metric.detach())
    (reference_grad,) = torch.autograd.grad(reference, reference_lp)
    torch.testing.assert_close(total / dp_size, reference, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad / dp_size, reference_grad, rtol=1e-6, atol=1e-6)
    # the engine averages over micro-batches and the controller over ranks; the service then averages :mean keys
    reduced = request_metrics({key: value / (dp_size * micro_batches) for key, value in metrics.items()}, len(data))
    assert reduced["loss:sum"] == pytest.approx(float(reference.detach()), rel=1e-5)
    for key, value in sums.items():
        assert reduced[key] == pytest.approx(value / len(data) if key.endswith(":mean") else value, rel=1e-5), key


def _tampered(edit) -> dict:
    body = copy.deepcopy(_body(*LOSSES["clipped_surrogate"]))
    edit(body)
    return body


def _node(body: dict, name: str) -> dict:
    return next(node for node in body["graph"]["nodes"] if node["name"] == name)


def _retarget(name: str, op: str, target: str):
    return lambda body: _node(body, name).update(op=op, target=target)


REFUSED = {
    "a builtin such as eval": (_retarget("exp", "call_function", "builtins.eval"), "unsupported: function 'builtins.eval'"),
    "torch.load": (_retarget("exp", "call_function", "torch.load"), "unsupported: function 'torch.load'"),
    "a factory of any size": (_retarget("exp", "call_function", "torch.zeros"), "unsupported: function 'torch.zeros'"),
    "os.system": (_retarget("exp", "call_function", "os.system"), "unsupported: function 'os.system'"),
    "backward()": (_retarget("clamp", "call_method", "backward"), "unsupported: tensor method 'backward'"),
    "an in-place method": (_retarget("clamp", "call_method", "clamp_"), "unsupported: tensor method 'clamp_'"),
    "a captured tensor": (_retarget("exp", "get_attr", "weight"), "unsupported: get_attr nodes"),
    "a module": (_retarget("exp", "call_module", "fc"), "unsupported: call_module nodes"),
    "an undefined reference": (lambda b: _node(b, "exp").update(args=[{"ref": "later"}]), "no earlier node defines"),
    "an unknown encoding": (lambda b: _node(b, "exp").update(args=[{"pickle": "..."}]), "not one of the SDK's"),
    "a private attribute": (lambda b: _node(b, "exp").update(target="getattr", args=[{"ref": "sub"}, "__class__"]),
                            "only the attributes"),
    "a huge Python power": (lambda b: _node(b, "mul").update(target="operator.pow", args=[10, 10**9]),
                            "an integer power above 64"),
    "a huge Python integer": (lambda b: _node(b, "mul").update(args=[10**12, 2]), "Python integers beyond 2\\*\\*31"),
    "a repeated sequence": (lambda b: _node(b, "mul").update(args=[[1.0], 10**6]), "operators on Python sequences"),
    "a list of too many items": (lambda b: _node(b, "minimum").update(target="torch.stack", args=[[{"ref": "mul"}] * 300]),
                                 "holds 300 items; at most 256"),
    "too many nodes": (lambda b: b["graph"].update(nodes=b["graph"]["nodes"][:1] * (MAX_NODES + 1)), "1 to 1024 nodes"),
    "rank-2 logprobs": (lambda b: b["inputs"][0].update(rank=2), "unsupported: logprobs of rank 2"),
    "a rank-2 input": (lambda b: b["inputs"][1].update(rank=2), "unsupported: input 'old' of rank 2"),
    "parameters that are not the inputs": (lambda b: b["inputs"][1].update(name="older"), "are not the declared inputs"),
    "a loss that ignores logprobs": (lambda b: _node(b, "sub").update(args=[{"ref": "old"}, {"ref": "old"}]),
                                     "does not depend on logprobs"),
    "a loss that is not a scalar": (lambda b: _node(b, "output").update(args=[{"tuple": [{"ref": "exp"}, {"dict": {}}]}]),
                                    "loss must be a scalar tensor"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_graph_that_reaches_beyond_the_allowed_operations_is_refused_at_creation(case):
    edit, message = REFUSED[case]
    with pytest.raises(CustomLossError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CustomLossStore().create(_tampered(edit), SESSION, ACCOUNT)


def test_a_loss_belongs_to_its_session_and_account():
    store = CustomLossStore()
    loss_id = store.create(_body(*LOSSES["clipped_surrogate"]), SESSION, ACCOUNT)
    for session, account in ((SESSION, "acct-2"), ("s1-def", ACCOUNT)):
        with pytest.raises(UnknownModelError, match="does not exist in session"):
            store.get({"loss_id": loss_id}, session, account)
    with pytest.raises(CustomLossError, match=r"\['beta'\] are not read by 'custom'"):
        store.get({"loss_id": loss_id, "beta": 0.1}, SESSION, ACCOUNT)
