"""Input pipelines: the datasets, their TFRecord shards, and each rank's tf.data batches."""

from globaldl.pipelines.datasets import DATASET_NAMES, dataset_spec, load_arrays
from globaldl.pipelines.pipeline import InputPipeline, make_pipeline
from globaldl.pipelines.spec import DatasetArrays, DatasetSpec
from globaldl.pipelines.tfrecords import ShardFileError

__all__ = [
    "DATASET_NAMES",
    "DatasetArrays",
    "DatasetSpec",
    "InputPipeline",
    "ShardFileError",
    "dataset_spec",
    "load_arrays",
    "make_pipeline",
]
