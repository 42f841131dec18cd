//! The progress display of `pipeline run`: an overall bar, a bar per running stage that reports
//! progress, and status lines above them (plain lines when stderr is not a terminal).

use std::collections::BTreeMap;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub(crate) struct Ui {
    mp: MultiProgress,
    overall: ProgressBar,
    bars: BTreeMap<String, ProgressBar>,
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
