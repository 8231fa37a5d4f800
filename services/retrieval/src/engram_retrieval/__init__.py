"""Engram retrieval service: gRPC MemoryService over Qdrant with ONNX models."""
