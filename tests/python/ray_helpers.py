"""What test_ray.py's Ray workers import (by name: the workers load it from PYTHONPATH)."""
import os

from inferrt.ray import LLMPredictor


class CrashOnce(LLMPredictor):
    """Kills its own process the first time a batch holds the row whose prompt is `marker`
    (a file records that it happened), as a lost node or an OOM kill would."""

    def __init__(self, flag_file, marker, **kwargs):
        super().__init__(**kwargs)
        self.flag_file, self.marker = flag_file, marker

    def __call__(self, batch):
        prompts = [str(p) for p in batch[self.prompt_column]]
        if self.marker in prompts and not os.path.exists(self.flag_file):
            with open(self.flag_file, "w") as f:
                f.write(str(os.getpid()))
            os._exit(1)
        return super().__call__(batch)
