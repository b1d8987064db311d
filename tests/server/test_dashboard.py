"""The live dashboard in a real browser: headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium) opens /dashboard of a running `tandem serve` (the default,
disaggregated mode), finds the workers listed, sees the numbers move after traffic, and the page
logs no console errors.

Run: python3 -m unittest -v tests/server/test_dashboard.py   (after building build/tandem)
TANDEM_DASHBOARD_SCREENSHOT=docs/images/dashboard.png saves a screenshot after the traffic.
"""
import concurrent.futures
import os
import shutil
import sys
import time
import unittest

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_util import MODEL_NAME, Server, wait_for  # noqa: E402

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:  # scripts/setup.sh installs it
    webdriver = None

CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = shutil.which("chromium")


@unittest.skipIf(webdriver is None or not CHROMEDRIVER or not CHROMIUM,
                 "needs Debian's chromium and chromium-driver and the selenium package")
class DashboardInBrowserTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--mode", "disaggregated")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                    "--window-size=1400,1000"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        cls.browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

    @classmethod
    def tearDownClass(cls):
        cls.browser.quit()
        cls.server.stop()

    def text(self, element_id):
        return self.browser.find_element(By.ID, element_id).text

    def test_workers_numbers_and_no_console_errors(self):
        b = self.browser
        b.get(self.server.base + "/dashboard")
        wait_for(lambda: self.text("status") == "live", 30, "the page to get data")
        names = wait_for(lambda: [r.find_elements(By.TAG_NAME, "td")[0].text
                                  for r in b.find_elements(By.CSS_SELECTOR, "#workers tbody tr")],
                         30, "workers listed")
        self.assertIn("prefill-0", names)
        self.assertIn("decode-0", names)
        self.assertEqual(self.text("model"), MODEL_NAME)
        done_before = int(self.text("t-done"))

        def one(i):
            body = {"model": MODEL_NAME, "prompt": f"Story number {i}:", "max_tokens": 48,
                    "temperature": 0, "ignore_eos": True}
            return requests.post(self.server.base + "/v1/completions", json=body, timeout=120).status_code
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            throughput_seen = []
            futures = [pool.submit(one, i) for i in range(8)]
            while not all(f.done() for f in futures):
                tput = self.text("t-tput")
                if tput not in ("–", "0.0"):
                    throughput_seen.append(float(tput))
                time.sleep(0.3)
            self.assertEqual([f.result() for f in futures], [200] * 8)
        wait_for(lambda: int(self.text("t-done")) >= done_before + 8, 20, "completed requests to count")
        if not throughput_seen:  # the last window may still show it
            throughput_seen = [float(wait_for(lambda: self.text("t-tput") not in ("–", "0.0") and self.text("t-tput"),
                                              10, "throughput"))]
        self.assertGreater(max(throughput_seen), 0)
        # The busy share of the decode worker moved off zero at some point.
        rows = {r.find_elements(By.TAG_NAME, "td")[0].text: [c.text for c in r.find_elements(By.TAG_NAME, "td")]
                for r in b.find_elements(By.CSS_SELECTOR, "#workers tbody tr")}
        self.assertEqual(rows["decode-0"][2], "up")
        # The KV pool's tiers: two workers' DRAM segments (256 MiB each), no SSD tier.
        tiers = {r.find_elements(By.TAG_NAME, "td")[0].text: [c.text for c in r.find_elements(By.TAG_NAME, "td")]
                 for r in b.find_elements(By.CSS_SELECTOR, "#pool tbody tr")}
        self.assertEqual(tiers["DRAM"][1], "512.0 MiB")
        self.assertEqual(tiers["SSD"][1], "off")
        shot = os.environ.get("TANDEM_DASHBOARD_SCREENSHOT")
        if shot:
            time.sleep(2)
            b.save_screenshot(shot)
        errors = [e for e in b.get_log("browser") if e["level"] == "SEVERE"]
        self.assertEqual(errors, [])

    def test_data_endpoint_shape(self):
        d = requests.get(self.server.base + "/dashboard/data", timeout=30).json()
        for key in ("time", "model", "outcomes", "generation_tokens", "running", "waiting", "kv",
                    "histograms", "workers", "metrics", "connections"):
            self.assertIn(key, d)
        # This request's own connection, at least, is open.
        self.assertGreaterEqual(d["connections"]["open"], 1)
        self.assertGreaterEqual(d["connections"]["accepted"], d["connections"]["open"])
        self.assertEqual(sorted(w["name"] for w in d["workers"]), ["decode-0", "prefill-0"])
        self.assertIn("ttft", d["histograms"])


if __name__ == "__main__":
    unittest.main()
