export PYTHONPATH=$PWD TRITON_CACHE_DIR=$PWD/scratch/triton_cache
pip install -q --no-index --find-links scratch/wheels fastapi uvicorn httpx gguf prometheus_client 2>&1 | grep -v WARN | tail -1
timeout 390 python -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py tests/test_engine_step.py tests/test_qspec.py tests/test_glu_epilogue.py tests/test_narrow_decode.py tests/test_gearbox.py --resume $OUT/passed.txt --stop-after 360 2>&1 | tail -5
wc -l $OUT/passed.txt
