import torch
from torch import nn

from mgpu_lib.model import Residual, block_shapes, forward_flops, init_weights, num_params, resnet18


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


def test_forward_flops_about_0_91_gflop():
    flops = forward_flops(resnet18())
    assert 0.90e9 < flops < 0.92e9
    # Width scales FLOPs quadratically (except the 1-channel stem and the fc layer).
    assert 14 < flops / forward_flops(resnet18(width=16)) < 17
