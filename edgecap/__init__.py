"""edgecap: caption live video on ARM boards with Coral EdgeTPUs."""

__version__ = "0.1.0"
