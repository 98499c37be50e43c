"""Pseudo FP16 (paper §4.3): FP16 storage with FP32 arithmetic.

The paper ran its speech models on Maxwell GPUs, which lack fast FP16 math, with weights,
activations and gradients stored in FP16 and the arithmetic in FP32; the authors checked that
this matched mixed-precision runs on V100, since a Tensor Core multiplies FP16 operands exactly
and adds in FP32. This mode reproduces that on any device:

- the model's weights are FP16 (the policy casts them, as for ``mixed``), and so are the tensors
  passed between operations: every output of an intercepted operation is rounded to FP16;
- the arithmetic-heavy operations (convolutions, matrix products, recurrent layers,
  normalisations, softmax and reductions) get FP32 copies of their FP16 operands and compute in
  FP32; their backward runs in FP32 too, and the gradient handed to the FP16 operand is rounded
  to FP16, so gradients between operations are FP16 as well;
- element-wise operations (add, relu, tanh, ...) run on the FP16 tensors themselves: PyTorch's
  element-wise kernels already compute in FP32 (``at::opmath_type<at::Half>`` is ``float``) and
  round the result, which is FP32 arithmetic with FP16 storage;
- losses return FP32, as under autocast, so the loss scaler sees the same value type.

It emulates numerics only. The FP32 operand copies are what autograd keeps for backward, so
memory and speed figures of this preset say nothing about FP16 storage; compare its accuracy.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

# PyTorch function names (a Tensor method, a torch.* function or a torch.nn.functional function:
# the mode sees the outermost one a module calls) that compute in FP32 here.
FP32_MATH = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "linear",
        "bilinear",
        "matmul",
        "__matmul__",
        "__rmatmul__",
        "mm",
        "bmm",
        "addmm",
        "addbmm",
        "baddbmm",
        "einsum",
        "mv",
        "dot",
        "rnn_tanh",
        "rnn_relu",
        "gru",
        "lstm",
        "gru_cell",
        "lstm_cell",
        "rnn_tanh_cell",
        "rnn_relu_cell",
        "batch_norm",
        "layer_norm",
        "group_norm",
        "instance_norm",
        # a normalisation like the ones above; it also pools internally (avg_pool3d), which the
        # CPU has no FP16 kernel for (alexnet, googlenet could not run this preset there)
        "local_response_norm",
        "softmax",
        "log_softmax",
        "sum",
        "mean",
        "var",
        "std",
        "norm",
        "cumsum",
        "logsumexp",
        "prod",
        "avg_pool1d",
        "avg_pool2d",
        "avg_pool3d",
        "adaptive_avg_pool1d",
        "adaptive_avg_pool2d",
        "adaptive_avg_pool3d",
    }
)
# losses: FP32 math and an FP32 result (a scalar; what the loss scaler multiplies)
FP32_RESULT = frozenset(
    {
        "cross_entropy",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "ctc_loss",
        "kl_div",
    }
)


def _upcast(x):
    return x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.float16 else x


def _round(x):
    return x.half() if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x


def _has_fp16(tree) -> bool:
    found = []
    tree_map(lambda x: found.append(isinstance(x, torch.Tensor) and x.dtype == torch.float16), tree)
    return any(found)


class PseudoFP16(TorchFunctionMode):
    """``with PseudoFP16(): loss = loss_fn(model(x16), y)`` — see the module docstring.

    Only operations with an FP16 operand change: an FP32 model under this mode runs as before.
    In-place and ``out=`` variants are not in the lists (they would write into the FP32 copy), so
    they run as they are, on FP16 storage.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in FP32_MATH and name not in FP32_RESULT:
            return func(*args, **kwargs)
        if not _has_fp16((args, kwargs)):
            return func(*args, **kwargs)
        out = func(*tree_map(_upcast, args), **tree_map(_upcast, kwargs))
        return out if name in FP32_RESULT else tree_map(_round, out)
