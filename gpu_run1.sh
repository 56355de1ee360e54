rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 EJK_CACHE_DIR=/tmp/ejk-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd benchmarks && python bench_triton_moe.py 2>&1 | grep -v "^WARNING\|^I0000\|^E0000" | grep "^|\|^-" | tail -30)
timeout 400 python -m pytest -q -m gpu plugins/ejk_triton/tests/test_grouped_matmul.py plugins/ejk_triton/tests/test_matmul.py -p no:cacheprovider 2>&1 | tail -3
