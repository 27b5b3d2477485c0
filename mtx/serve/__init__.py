"""`mtx serve`: a translation service over HTTP.

engine.py decodes (mtx's search, or a CTranslate2 export), batcher.py batches the sentences of
concurrent requests for one worker, app.py is the FastAPI app and the uvicorn server,
metrics.py the Prometheus metrics, page.html the page at `GET /`. FastAPI, uvicorn and
prometheus_client come with `pip install 'mtx[serve]'`.
"""
