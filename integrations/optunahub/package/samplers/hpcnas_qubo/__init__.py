from .sampler import QUBOSampler


__all__ = ["QUBOSampler"]
