from setuptools import setup

setup(
    name="fi-cache-test-plugin",
    version="0",
    py_modules=["fi_cache_test_plugin"],
    entry_points={"vllm.general_plugins": ["fi_cache_test = fi_cache_test_plugin:register"]},
)
