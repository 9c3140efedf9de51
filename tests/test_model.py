import pytest
import torch
from torch import nn

from mgpu_lib.model import (Residual, block_shapes, forward_flops,
                            init_weights, num_params, resnet18, train_flops)


def test_block_shapes_match_the_chapter():
    shapes = dict(block_shapes(resnet18()))
    assert shapes["resnet_block1"] == (64, 28, 28)
    assert shapes["resnet_block2"] == (128, 14, 14)
    assert shapes["resnet_block3"] == (256, 7, 7)
    assert shapes["resnet_block4"] == (512, 4, 4)
    assert shapes["fc"] == (10,)


def test_parameter_count_is_the_chapters():
    assert num_params(resnet18(10)) == 11_175_818


def test_width_scales_every_stage():
    shapes = dict(block_shapes(resnet18(width=16)))
    assert shapes["resnet_block4"] == (128, 4, 4)
    assert num_params(resnet18(width=16)) < num_params(resnet18()) / 10


def test_module_names():
    names = [n for n, _ in resnet18().named_children()]
    assert names[3:] == ["resnet_block1", "resnet_block2", "resnet_block3", "resnet_block4",
                         "global_avg_pool", "fc"]


def test_init_weights_reaches_every_conv_and_linear():
    torch.manual_seed(0)
    net = resnet18(width=8)
    layers = [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for m in layers:
        nn.init.constant_(m.weight, 5.0)
    init_weights(net, std=0.01)
    assert len(layers) == 21      # 17 convs of the plain path, 3 1x1 shortcuts, 1 linear
    for m in layers:
        assert m.weight.abs().max() < 0.1     # every one was redrawn from N(0, 0.01^2)
        assert 0.005 < m.weight.std() < 0.02 or m.weight.numel() < 100


def test_residual_projection_changes_shape():
    blk = Residual(3, 6, use_1x1conv=True, strides=2)
    assert blk(torch.zeros(2, 3, 8, 8)).shape == (2, 6, 4, 4)


def hand_count(net: nn.Module) -> int:
    """Forward FLOPs per image counted layer by layer with hooks (what model.py did before):
    2 x kernel area x input channels per convolution output, 2 x in x out per linear layer."""
    total = 0

    def conv(m, inp, out):
        nonlocal total
        total += 2 * m.kernel_size[0] * m.kernel_size[1] * m.in_channels * out[0].numel()

    def linear(m, inp, out):
        nonlocal total
        total += 2 * m.in_features * m.out_features
    hooks = [m.register_forward_hook(conv if isinstance(m, nn.Conv2d) else linear)
             for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    block_shapes(net)
    for h in hooks:
        h.remove()
    return total


@pytest.mark.parametrize("width", [64, 8])
def test_flop_counter_agrees_with_the_hand_count(width):
    """torch's FlopCounterMode gives the hand count's forward FLOPs exactly, and for a training
    step 3x that less the stem's input gradient (the one product nothing needs)."""
    net = resnet18(width=width)
    hand = hand_count(net)
    assert forward_flops(net) == hand
    stem_input_grad = 2 * 3 * 3 * 1 * width * 28 * 28
    # the backward: two products per layer as large as the forward's (input and weight
    # gradients), less the stem's input gradient, which nothing needs (2.999x at width 64)
    assert train_flops(net) == 3 * hand - stem_input_grad
    if width == 64:
        assert hand == 911_601_664                  # scaling.Workload's 0.9116e9
    assert all(p.device.type == "cpu" for p in net.parameters())   # counted on a meta copy


def test_forward_flops_scale_with_width():
    # Width scales FLOPs quadratically (except the 1-channel stem and the fc layer).
    assert 14 < forward_flops(resnet18()) / forward_flops(resnet18(width=16)) < 17
