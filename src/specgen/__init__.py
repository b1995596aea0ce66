"""specgen: lossless speculative generation with a draft model and a target model."""

__version__ = "0.1.0"
