"""The signed model registry (`service`), ONNX inspection for a push, and sample models."""
