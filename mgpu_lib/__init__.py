"""mgpu_lib: the code of D2L 12.6, "Concise Implementation for Multiple GPUs", done right.

    import mgpu_lib as mg
    config = mg.TrainConfig(devices=2, batch_size=512, lr=0.2)   # the chapter's 2-GPU run
    result = mg.train(config)            # a fresh ResNet-18 in nn.DataParallel
    print(result.summary())              # 'test acc: 0.91, 7.5 sec/epoch on 2 x ...'

The core a learner opens sits at the top of the package: `model` (the ResNet-18), `devices`,
`data` (Fashion-MNIST on the device), `config` (what a run is), `training` (the
loop), `ddp` (one DistributedDataParallel rank), `split` and `hetero` (a GPU and a CPU
together). Beside it: `perf` (the step-time model and its evidence), `lab` (the experiments the
pages run, D2L's own code to compare in `lab.d2l`, the DDP launcher) and `book` (profiles,
records, verdicts, figures, the command line). Importing runs nothing: devices are looked up when called.
"""
from .config import TrainConfig
from .data import DeviceLoader, load_fashion_mnist
from .devices import (DeviceError, describe_devices, num_gpus, resolve_devices, synchronize, timed,
                      try_all_gpus, try_gpu)
from .hetero import HeteroDataParallel
from .model import block_shapes, init_weights, num_params, resnet18, same_weights
from .split import split_sizes
from .training import (TrainResult, evaluate_accuracy, fit, make_model, make_step,
                       train)

__all__ = ["DeviceError", "DeviceLoader", "HeteroDataParallel", "TrainConfig", "TrainResult",
           "block_shapes", "describe_devices", "evaluate_accuracy", "fit",
           "init_weights", "load_fashion_mnist", "make_model",
           "make_step", "num_gpus", "num_params", "resnet18", "resolve_devices", "same_weights",
           "split_sizes", "synchronize", "timed", "train", "try_all_gpus", "try_gpu"]
