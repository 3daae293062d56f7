from setuptools import setup

setup(cffi_modules=["geco/_hwloc_build.py:ffibuilder", "geco/_lane_build.py:ffibuilder"])
