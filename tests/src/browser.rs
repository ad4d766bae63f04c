//! Headless Chromium driven through W3C WebDriver: Debian's `chromedriver`
//! on an ephemeral loopback port, spoken to with the suite's own HTTP
//! client. A CDP crate did the same, but its generated protocol types took
//! sixteen minutes of CI's build; WebDriver's handful of JSON requests
//! need no new dependency.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use base64::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long finding an element, a page load or a script may take before
/// the step fails: generous, for CI machines at a sixth of their speed.
const STEP: Duration = Duration::from_secs(30);

/// The key WebDriver names an element reference by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One browser session; dropping it ends the session and its chromedriver.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    http: reqwest::Client,
}

/// An element found on the page.
pub struct Element(String);

fn installed(variable: &str, default: &str, package: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os(variable).map_or_else(|| PathBuf::from(default), PathBuf::from);
    if !path.exists() {
        bail!(
            "{} is missing: ops/scripts/test.sh installs Debian's {package}",
            path.display()
        );
    }
    Ok(path)
}

impl Browser {
    /// Starts chromedriver and a headless, offline Chromium session
    /// (`CHROMIUM` and `CHROMEDRIVER` override the Debian paths).
    pub async fn start() -> anyhow::Result<Browser> {
        let chromium = installed("CHROMIUM", "/usr/bin/chromium", "chromium")?;
        let chromedriver = installed("CHROMEDRIVER", "/usr/bin/chromedriver", "chromium-driver")?;
        // chromedriver can exit at start without a word (it has on CI):
        // a start is tried three times, and a failure says how it exited.
        let mut tries = 0;
        let (driver, port) = loop {
            tries += 1;
            let mut driver = Command::new(&chromedriver)
                .arg("--port=0")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("starting chromedriver")?;
            match announced_port(&mut driver).await {
                Ok(port) => break (driver, port),
                Err(e) if tries < 3 => {
                    eprintln!(
                        "chromedriver start {tries} failed ({e}: {:?}); again",
                        driver.try_wait()
                    );
                }
                Err(e) => return Err(e.context(format!("{:?}", driver.try_wait()))),
            }
        };
        let http = reqwest::Client::builder().no_proxy().build()?;
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            http,
        };
        let millis = STEP.as_millis() as u64;
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "timeouts": {"implicit": millis, "pageLoad": millis, "script": millis},
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900",
                         "--no-first-run", "--disable-background-networking",
                         "--disable-component-update", "--disable-sync", "--disable-quic"]
            }
        }}});
        let created = browser
            .command(reqwest::Method::POST, "/session", Some(capabilities))
            .await?;
        browser.session = created["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no sessionId in {created}"))?
            .to_owned();
        Ok(browser)
    }

    /// Opens `url` and waits for the page to load.
    pub async fn navigate(&self, url: &str) -> anyhow::Result<()> {
        self.post("/url", json!({ "url": url })).await.map(drop)
    }

    /// The value of the JavaScript expression `js` (a promise is awaited).
    pub async fn evaluate(&self, js: &str) -> anyhow::Result<Value> {
        let script = format!("return ({js});");
        self.post("/execute/sync", json!({"script": script, "args": []}))
            .await
    }

    /// Evaluates `js` until it gives `want` (the page refreshes once a
    /// second), for at most 20 s; returns the last value.
    pub async fn shows(&self, js: &str, want: &Value) -> Value {
        let mut last = Value::Null;
        for _ in 0..100 {
            last = self.evaluate(js).await.unwrap_or_default();
            if &last == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        last
    }

    /// The first element matching the CSS `selector`, waiting for it to
    /// appear for as long as a step may take.
    pub async fn find(&self, selector: &str) -> anyhow::Result<Element> {
        let found = self
            .post(
                "/element",
                json!({"using": "css selector", "value": selector}),
            )
            .await
            .with_context(|| format!("finding {selector}"))?;
        found[ELEMENT]
            .as_str()
            .map(|id| Element(id.to_owned()))
            .ok_or_else(|| anyhow!("no element reference in {found}"))
    }

    /// The element's rendered text.
    pub async fn text(&self, element: &Element) -> anyhow::Result<String> {
        let path = format!("/element/{}/text", element.0);
        let text = self.get(&path).await?;
        Ok(text.as_str().unwrap_or_default().to_owned())
    }

    /// Clicks the element as a user would: a pointer click at its centre.
    pub async fn click(&self, element: &Element) -> anyhow::Result<()> {
        let path = format!("/element/{}/click", element.0);
        self.post(&path, json!({})).await.map(drop)
    }

    /// Types `text` into the element (an input) as a user would, key by
    /// key.
    pub async fn type_text(&self, element: &Element, text: &str) -> anyhow::Result<()> {
        let path = format!("/element/{}/value", element.0);
        self.post(&path, json!({ "text": text })).await.map(drop)
    }

    /// The visible page as PNG bytes.
    pub async fn screenshot(&self) -> anyhow::Result<Vec<u8>> {
        let shot = self.get("/screenshot").await?;
        let encoded = shot.as_str().ok_or_else(|| anyhow!("no image in {shot}"))?;
        Ok(base64::engine::general_purpose::STANDARD.decode(encoded)?)
    }

    fn at(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.command(reqwest::Method::GET, &self.at(path), None)
            .await
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.command(reqwest::Method::POST, &self.at(path), Some(body))
            .await
    }

    /// Sends one WebDriver command; its `value`, or the error it names.
    async fn command(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.with_context(|| url.clone())?;
        let status = response.status();
        let mut answer: Value = response.json().await.with_context(|| url.clone())?;
        let value = answer["value"].take();
        if !status.is_success() {
            bail!(
                "{path}: {status}: {} {}",
                value["error"],
                value["message"].as_str().unwrap_or_default()
            );
        }
        Ok(value)
    }
}

/// Reads chromedriver's stdout until it says which port it listens on.
async fn announced_port(driver: &mut Child) -> anyhow::Result<u16> {
    let stdout = driver.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            if let Some((_, rest)) = line.split_once("started successfully on port ") {
                return rest
                    .trim_end_matches('.')
                    .parse::<u16>()
                    .map_err(Into::into);
            }
        }
        Err(anyhow!("chromedriver exited before it listened"))
    };
    let port = tokio::time::timeout(STEP, read)
        .await
        .context("chromedriver never said its port")??;
    // Keep reading, so chromedriver never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(port)
}

impl Drop for Browser {
    /// Ends the session first: chromedriver quits Chromium then, which
    /// killing chromedriver alone would leave running. Blocking, on a plain
    /// socket, as `Drop` cannot await.
    fn drop(&mut self) {
        if self.session.is_empty() {
            return;
        }
        let end = || -> std::io::Result<()> {
            let mut socket = TcpStream::connect(("127.0.0.1", self.port))?;
            socket.set_read_timeout(Some(STEP))?;
            write!(
                socket,
                "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                self.session
            )?;
            socket.read_to_end(&mut Vec::new()).map(drop)
        };
        let _ = end();
        let _ = self.driver.start_kill();
    }
}
