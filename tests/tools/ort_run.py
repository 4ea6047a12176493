"""Run an ONNX model with whichever onnxruntime PYTHONPATH provides (an old one for the
compatibility test): ``ort_run.py MODEL FEED.npz OUT.npy OUTPUT_NAME``. Prints the
onnxruntime version; imports nothing of rlinkd."""
import sys

import numpy as np
import onnxruntime as ort

model, feed, out, name = sys.argv[1:]
inputs = dict(np.load(feed))
np.save(out, ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run([name], inputs)[0])
print("onnxruntime", ort.__version__)
