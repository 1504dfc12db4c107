// Drives a real chromium through playwright-core for cli/tests/browser.rs.
//
// One JSON request per line on stdin, one JSON answer per line on stdout:
// {"ok": true, ...} or {"ok": false, "error": "..."}. The test decides what
// happens and checks what the agent sees; this script only works the page.
//
// Environment: NODE_PATH names the node_modules folder holding
// playwright-core; GRAPH_RELAY_CHROMIUM the browser binary.
//
// Requests:
//   {"op": "open", "url": U}                     launch the browser, open U
//   {"op": "row", "table": T, "id": ID}          wait for the run's row in table T; its text
//   {"op": "gone", "table": T, "id": ID}         wait until the row is gone
//   {"op": "cell_text", "table": T, "id": ID, "cell": C, "contains": S?, "not": S?}
//                                                wait for the row's cell C (a class) to
//                                                contain S / to differ from S; its text
//   {"op": "click", "table": T, "id": ID, "button": B, "dialog": D?}
//                                                click the row's button B; a dialog
//                                                (prompt, confirm) is accepted with D
//   {"op": "screenshot", "path": P}              a full-page PNG
//   {"op": "close"}
"use strict";

const readline = require("node:readline");
const { chromium } = require("playwright-core");

const TIMEOUT = 20000;
let browser = null;
let page = null;
let dialogAnswer = null;

function row(table, id) {
  return page.locator(`#${table} tbody tr[data-command="${id}"]`);
}

async function handle(req) {
  switch (req.op) {
    case "open": {
      browser = await chromium.launch({
        executablePath: process.env.GRAPH_RELAY_CHROMIUM,
        headless: true,
        // Root in CI: chromium's sandbox needs a user namespace it may not get.
        args: ["--no-sandbox", "--disable-dev-shm-usage"],
      });
      page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
      page.setDefaultTimeout(TIMEOUT);
      page.on("dialog", async (dialog) => {
        const answer = dialogAnswer;
        dialogAnswer = null;
        if (answer === null) await dialog.dismiss();
        else await dialog.accept(answer);
      });
      const response = await page.goto(req.url);
      return { status: response ? response.status() : 0, title: await page.title() };
    }
    case "row": {
      const r = row(req.table, req.id);
      await r.waitFor({ state: "visible" });
      return { text: await r.innerText() };
    }
    case "gone": {
      await row(req.table, req.id).waitFor({ state: "detached" });
      return {};
    }
    case "cell_text": {
      const cell = row(req.table, req.id).locator(`.${req.cell}`);
      const deadline = Date.now() + TIMEOUT;
      for (;;) {
        const text = await cell.innerText().catch(() => "");
        const hasIt = req.contains === undefined || text.includes(req.contains);
        const differs = req.not === undefined || text !== req.not;
        if (text && hasIt && differs) return { text };
        if (Date.now() > deadline) {
          throw new Error(`cell .${req.cell} of ${req.id} in #${req.table} never matched: "${text}"`);
        }
        await page.waitForTimeout(50);
      }
    }
    case "click": {
      dialogAnswer = req.dialog === undefined ? null : req.dialog;
      await row(req.table, req.id).locator(`button.${req.button}`).click();
      return {};
    }
    case "screenshot": {
      await page.screenshot({ path: req.path, fullPage: true });
      return {};
    }
    case "close": {
      if (browser) await browser.close();
      browser = null;
      return {};
    }
    default:
      throw new Error(`unknown op ${req.op}`);
  }
}

const lines = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
lines.on("line", (line) => {
  queue = queue.then(async () => {
    let answer;
    try {
      answer = { ok: true, ...(await handle(JSON.parse(line))) };
    } catch (e) {
      answer = { ok: false, error: String(e && e.stack ? e.stack : e) };
    }
    process.stdout.write(JSON.stringify(answer) + "\n");
  });
});
lines.on("close", () => {
  queue.then(async () => {
    if (browser) await browser.close();
    process.exit(0);
  });
});
