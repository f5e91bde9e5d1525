"""The protobuf bodies against the SDK's own encoders and decoders: what the SDK sends decodes to the same
data here, and what the server writes decodes in the SDK to the same values."""

from __future__ import annotations

import numpy as np
import pytest
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from rlflow.service.wire import (
    MalformedBodyError,
    TOPK_SENTINEL_LOGPROB,
    SampledSequence,
    TopkArrays,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)


def _request_bytes(data: list, loss_fn: str = "ppo", config: dict | None = None) -> bytes:
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id="s0:train:3", seq_id=7)
    return forward_backward_request_to_proto(request).SerializeToString()


def test_a_forward_backward_request_of_the_sdk_decodes_to_its_data():
    chunks = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[5, 6]), types.EncodedTextChunk(tokens=[7])])
    datum = types.Datum(model_input=chunks, loss_fn_inputs={"target_tokens": [6, 7, 9], "logprobs": [-0.5, -1.25, -2.0],
                                                            "advantages": [1.0, 1.0, -3.5]})
    call = decode_forward_backward(_request_bytes([datum], config={"clip_high_threshold": 1.3}))
    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == ("s0:train:3", 7, "ppo", False)
    assert call.loss_fn_config == {"clip_high_threshold": 1.3}
    (decoded,) = call.data
    assert decoded.tokens == [5, 6, 7]
    assert decoded.loss_fn_inputs == {"target_tokens": [6, 7, 9], "logprobs": [-0.5, -1.25, -2.0], "advantages": [1.0, 1.0, -3.5]}


def test_the_server_outputs_decode_in_the_sdk():
    logprobs = [[-0.5, -1.5], [-0.25, -2.0, -3.0]]
    output = deserialize_forward_backward_output(encode_forward_backward_output(logprobs, {"loss:sum": 4.5}))
    assert output.metrics == {"loss:sum": 4.5}
    assert [record["logprobs"].tolist() for record in output.loss_fn_outputs] == logprobs

    sample = deserialize_sample_response(encode_sample_response(
        [SampledSequence([3, 4, 2], [-0.5, -0.25, -1.0], stopped=True), SampledSequence([9], [-2.0], stopped=False)]))
    assert [(s.tokens, s.logprobs, s.stop_reason) for s in sample.sequences] == [
        ([3, 4, 2], [-0.5, -0.25, -1.0], "stop"), ([9], [-2.0], "length")]


def test_prompt_logprobs_and_top_k_decode_in_the_sdk_with_unscored_positions_as_none():
    ids = np.array([[0, 0], [5, 7], [2, 9]], dtype=np.int32)
    values = np.array([[TOPK_SENTINEL_LOGPROB] * 2, [-0.1, -2.5], [-0.7, -0.9]], dtype=np.float32)
    sample = deserialize_sample_response(encode_sample_response(
        [SampledSequence([3], [-0.5], stopped=False)], np.array([np.nan, -0.25, -1.5]), TopkArrays(ids, values)))
    assert sample.prompt_logprobs == [None, -0.25, -1.5]
    assert sample.topk_prompt_logprobs == [None, [(5, pytest.approx(-0.1)), (7, -2.5)], [(2, pytest.approx(-0.7)),
                                                                                           (9, pytest.approx(-0.9))]]
    assert deserialize_sample_response(encode_sample_response([])).prompt_logprobs is None


@pytest.mark.parametrize("body,message", [
    (b"\xff\xff\xff", "not a ForwardBackwardRequest protobuf"),
    (b"", "names no model_id"),
])
def test_a_malformed_body_is_refused_in_one_line(body, message):
    with pytest.raises(MalformedBodyError, match=message):
        decode_forward_backward(body)


def test_inputs_the_server_cannot_run_are_refused():
    image = types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)])
    with pytest.raises(MalformedBodyError, match="'image' is not supported"):
        decode_forward_backward(_request_bytes([types.Datum(model_input=image, loss_fn_inputs={"target_tokens": [1] * 4})]))
