"""The benchmark requests of a sweep point, sent the way SGLang's bench_serving.py sends them, standard library only.

Streamed /generate requests (text, temperature, max_new_tokens, ignore_eos), at most `concurrency` in flight,
each read to `data: [DONE]`: first the warm-up requests, then for each load level `repeats` runs of its prompts.
Prints JSON: the wall-clock start and stop of the warm-up and of every run, and its failed requests.

    plain_bench.py URL REQUESTS_JSON
    REQUESTS_JSON: {"warmup": [prompt, ...], "levels": [{"concurrency": 4, "prompts": [...]}], "repeats": 1,
                    "max_new_tokens": 32, "ignore_eos": true, "temperature": 0}
"""

import http.client
import json
import sys
import threading
import time
from urllib.parse import urlparse


def generate(url, prompt, spec):
    target = urlparse(url)
    body = {
        "text": prompt,
        "sampling_params": {
            "temperature": spec["temperature"],
            "max_new_tokens": spec["max_new_tokens"],
            "ignore_eos": spec["ignore_eos"],
        },
        "stream": True,
    }
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=300)
    try:
        connection.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            return False
        for line in response:
            if line.strip() == b"data: [DONE]":
                return True
        return False
    except OSError:
        return False
    finally:
        connection.close()


def run(url, prompts, concurrency, spec):
    """Send every prompt with at most `concurrency` in flight; return (start, stop, failed requests)."""
    pending = list(enumerate(prompts))
    lock = threading.Lock()
    failed = []

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                _index, prompt = pending.pop(0)
            if not generate(url, prompt, spec):
                with lock:
                    failed.append(prompt)

    threads = [threading.Thread(target=worker) for _thread in range(min(concurrency, len(prompts)))]
    start = time.time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"start": start, "stop": time.time(), "failed": len(failed)}


def main():
    url, spec = sys.argv[1], json.loads(open(sys.argv[2]).read())
    result = {"warmup": None, "levels": []}
    if spec["warmup"]:
        result["warmup"] = run(url, spec["warmup"], spec["levels"][0]["concurrency"], spec)
    for level in spec["levels"]:
        runs = [run(url, level["prompts"], level["concurrency"], spec) for _repeat in range(spec["repeats"])]
        result["levels"].append({"concurrency": level["concurrency"], "runs": runs})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
