"""The accuracy-drop experiment's parts (mgpu_lib.lab.drop), on a tiny scale."""
from torch import nn

from mgpu_lib.lab.d2l import chapter_init_weights, lazy_resnet18
from mgpu_lib.lab.drop import CONDITIONS, EXTRA, reset_like_mxnet, run_seed


def test_the_mxnet_like_reset_leaves_every_layer_to_the_init_and_biases_at_zero():
    net = reset_like_mxnet(lazy_resnet18(width=4))
    layers = [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert all(not isinstance(m.weight, nn.parameter.UninitializedParameter) for m in layers)
    assert all(m.bias is None or not m.bias.any() for m in layers)
    assert chapter_init_weights(net) == len(layers)         # the chapter's init reaches all
    bn = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(m.running_mean.eq(0).all() and m.running_var.eq(1).all() for m in bn)


def test_each_condition_runs_at_its_batch_and_lr():
    records = run_seed(0, width=4, batch_size=16, lr=0.1, num_epochs=1, train_limit=64,
                       test_limit=20, source="synthetic", conditions=CONDITIONS + EXTRA)
    got = {r["condition"]: (r["config"]["batch_size"], r["config"]["lr"]) for r in records}
    assert got == {"first": (16, 0.1), "reused": (32, 0.2), "fresh": (32, 0.2),
                   "fresh_small": (16, 0.1), "first_large": (32, 0.2)}
    assert all(len(r["test_acc"]) == 1 and r["data_source"] == "synthetic" for r in records)


def test_each_run_is_saved_as_it_ends_with_batchnorm_readings_at_the_last_epoch():
    saved = []
    records = run_seed(0, width=4, batch_size=16, lr=0.1, num_epochs=2, train_limit=64,
                       test_limit=20, source="synthetic", conditions=("reused",),
                       save=saved.append)
    assert [r["condition"] for r in records] == ["reused"] and saved == records  # no "first"
    (r,) = records
    assert len(r["test_acc"]) == 2
    for key in ("test_acc_batch", "test_acc_recal", "train_acc_recal"):
        assert len(r[key]) == 1 and 0 <= r[key][0] <= 1
