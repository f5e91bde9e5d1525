"""The Tinker protobuf bodies: ``ForwardBackwardRequest`` in, ``ForwardBackwardOutput`` and ``SampleResponse`` out.

The message classes are the SDK's own (``tinker.proto.tinker_public_pb2``, package ``tinker``), so
the server reads and writes exactly the schema the client was built with. Tensors travel as raw
little-endian bytes: tokens as int32, per-position inputs as float32 or int64 with a shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from rlflow.errors import UserError
from rlflow.service.batches import Datum

PROTOBUF = "application/x-protobuf"
TOPK_SENTINEL_LOGPROB = -99999.0  # tinker.types.topk_logprobs.MASK_LOGPROB: an unscored top-k position
_NUMPY_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


class MalformedBodyError(UserError, ValueError):
    """A request body is not the protobuf message its endpoint takes, or holds what the service cannot run."""


@dataclass
class ForwardBackwardCall:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str
    seq_id: Optional[int]
    data: list[Datum]
    loss_fn: str
    loss_fn_config: dict[str, float | str]  # numbers, and a custom loss's text loss_id
    forward_only: bool


def _tensor_values(name: str, tensor: pb.Tensor) -> list[float]:
    if tensor.WhichOneof("encoding") != "dense":
        raise MalformedBodyError(f"loss_fn_inputs[{name!r}]: only dense 1-D tensors are supported, got a sparse one")
    dtype = _NUMPY_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise MalformedBodyError(f"loss_fn_inputs[{name!r}]: dtype {pb.DType.Name(tensor.dtype)} is not supported")
    values = np.frombuffer(tensor.dense, dtype=np.dtype(dtype).newbyteorder("<"))
    if len(tensor.shape) > 1:
        raise MalformedBodyError(f"loss_fn_inputs[{name!r}]: shape {list(tensor.shape)} is not one value per position")
    return values.tolist()


def _tokens(index: int, datum: pb.Datum) -> list[int]:
    tokens: list[int] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise MalformedBodyError(f"datum {index}: model_input chunk of type {kind!r} is not supported (text tokens only)")
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype="<i4").tolist()
    return tokens


def _loss_fn_config(message: pb.ForwardBackwardRequest) -> dict[str, float | str]:
    if message.loss_fn_config_v2:
        return {key: value.number if value.WhichOneof("value") == "number" else value.text
                for key, value in message.loss_fn_config_v2.items()}
    return dict(message.loss_fn_config)


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """A ``ForwardBackwardRequest`` body as a ``ForwardBackwardCall``; ``MalformedBodyError`` when it is not one."""
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as error:
        raise MalformedBodyError(f"the body is not a ForwardBackwardRequest protobuf ({error})") from None
    if not message.model_id:
        raise MalformedBodyError("the ForwardBackwardRequest names no model_id")
    data = [
        Datum(_tokens(index, datum), {name: _tensor_values(name, tensor) for name, tensor in datum.loss_fn_inputs.items()})
        for index, datum in enumerate(message.data)
    ]
    return ForwardBackwardCall(
        model_id=message.model_id,
        seq_id=message.seq_id or None,
        data=data,
        loss_fn=message.loss_fn,
        loss_fn_config=_loss_fn_config(message),
        forward_only=message.forward_only,
    )


def _float_bytes(values: list[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def encode_forward_backward_output(logprobs: list[list[float]], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: each datum's target log-probs (``loss_fn_outputs[i]["logprobs"]``) and metrics."""
    chunks = [_float_bytes(values) for values in logprobs]
    offsets = np.cumsum([0] + [len(chunk) for chunk in chunks], dtype=np.int64)
    record = pb.ArrayRecord(num_datums=len(logprobs))
    record.fields["logprobs"].CopyFrom(pb.BatchedTensor(data=b"".join(chunks), offsets=offsets.astype("<i8").tobytes(),
                                                        dtype=pb.DTYPE_FLOAT32))
    output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for key, value in metrics.items():
        output.metrics[key] = float(value)
    return output.SerializeToString()


@dataclass
class SampledSequence:
    """One sample: its tokens, the log-prob of each, and whether it ended on a stop (else on the length limit)."""

    tokens: list[int]
    logprobs: list[float]
    stopped: bool


@dataclass
class TopkArrays:
    """Top-k log-probs at each prompt position: ``ids`` (int32) and ``logprobs`` (float32), both ``[P, k]``, most
    likely first; an unscored position holds the SDK's sentinel (id 0, log-prob ``TOPK_SENTINEL_LOGPROB``)."""

    ids: np.ndarray
    logprobs: np.ndarray


def encode_sample_response(sequences: list[SampledSequence], prompt_logprobs: Optional[np.ndarray] = None,
                           topk_prompt: Optional[TopkArrays] = None) -> bytes:
    """A ``SampleResponse``; ``prompt_logprobs`` (``[P]``, NaN where unscored) and ``topk_prompt`` only when the
    request asked for them."""
    response = pb.SampleResponse()
    for sequence in sequences:
        response.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if sequence.stopped else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(sequence.tokens, dtype="<i4").tobytes(),
            logprobs=_float_bytes(sequence.logprobs),
        )
    if prompt_logprobs is not None:
        response.prompt_logprobs = _float_bytes(prompt_logprobs)
    if topk_prompt is not None:
        length, k = topk_prompt.ids.shape
        response.topk_prompt_logprobs.CopyFrom(pb.TopkLogprobs(
            token_ids=np.ascontiguousarray(topk_prompt.ids, dtype="<i4").tobytes(),
            logprobs=_float_bytes(topk_prompt.logprobs), k=k, length=length))
    return response.SerializeToString()
