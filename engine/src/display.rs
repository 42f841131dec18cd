//! The progress display of `pipeline run`: an overall bar, a bar per running stage that reports
//! progress, and status lines above them. When stderr is not a terminal (a batch job, `nohup`,
//! a pipe) there are no bars: status lines are plain lines, and each running stage's progress is
//! a plain line at most every `PLAIN_PROGRESS_EVERY`, so an hour-long stage's log shows it moving.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a running stage's progress is printed as a plain line without a terminal.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(30);

pub(crate) struct Ui {
    mp: MultiProgress,
    overall: ProgressBar,
    bars: BTreeMap<String, ProgressBar>,
    /// Without a terminal: when each running stage's progress was last printed.
    printed: BTreeMap<String, Instant>,
}

impl Ui {
    pub(crate) fn new(total: u64) -> Ui {
        let mp = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let overall = mp.add(ProgressBar::new(total));
        overall.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} stages {msg}")
                .expect("template"),
        );
        Ui {
            mp,
            overall,
            bars: BTreeMap::new(),
            printed: BTreeMap::new(),
        }
    }

    pub(crate) fn line(&self, s: &str) {
        if self.mp.is_hidden() {
            eprintln!("{s}");
        } else {
            let _ = self.mp.println(s);
        }
    }

    pub(crate) fn progress(&mut self, key: &str, label: &str, pos: u64, len: u64, msg: &str) {
        if self.mp.is_hidden() {
            // The first report of a stage waits a period too: short stages print nothing extra.
            let since = *self.printed.entry(key.to_string()).or_insert_with(Instant::now);
            if since.elapsed() >= PLAIN_PROGRESS_EVERY {
                eprintln!("{}", plain_progress_line(label, pos, len, msg));
                self.printed.insert(key.to_string(), Instant::now());
            }
            return;
        }
        let bar = self.bars.entry(key.to_string()).or_insert_with(|| {
            let b = self.mp.add(ProgressBar::new(len));
            b.set_style(
                ProgressStyle::with_template("  {prefix:24} {bar:24} {pos}/{len} {msg}")
                    .expect("template"),
            );
            b.set_prefix(label.to_string());
            b
        });
        bar.set_length(len);
        bar.set_position(pos);
        bar.set_message(msg.to_string());
    }

    pub(crate) fn done(&mut self, key: &str) {
        self.printed.remove(key);
        if let Some(b) = self.bars.remove(key) {
            b.finish_and_clear();
            self.mp.remove(&b);
        }
        self.overall.inc(1);
    }
}

impl Ui {
    pub(crate) fn finish(&self) {
        self.overall.finish_and_clear();
    }
}

/// `  mc5 340/1200 (28%) mc 85 tok/s`: one stage's progress as a plain log line.
fn plain_progress_line(label: &str, pos: u64, len: u64, msg: &str) -> String {
    let pct = (pos * 100).checked_div(len).map_or(String::new(), |p| format!(" ({p}%)"));
    let msg = if msg.is_empty() { String::new() } else { format!(" {msg}") };
    format!("  {label} {pos}/{len}{pct}{msg}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_progress_line_names_the_stage_its_position_and_message() {
        assert_eq!(plain_progress_line("mc5", 340, 1200, "mc 85 tok/s"), "  mc5 340/1200 (28%) mc 85 tok/s");
        assert_eq!(plain_progress_line("sft", 3, 0, ""), "  sft 3/0");
    }
}
