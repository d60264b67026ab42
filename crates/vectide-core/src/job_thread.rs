//! Process-wide job threads: one plain thread per name (`vectide-{name}`,
//! started on first use), which runs the jobs submitted under that name
//! one after the other.
//!
//! For long maintenance jobs that hold their index's locks across parallel
//! work (a standalone baseline's consolidation, a standalone `spann`
//! rebuild): on a rayon worker, a wait inside that parallel work may pick
//! up another queued task meanwhile — another index's whole job, with the
//! first index's locks still held. A plain thread runs one job at a time
//! and picks up nothing; the job's parallel work runs on its index's own
//! pool. The threads a process runs for these jobs are bounded by the
//! names in use, not by its indexes.

use parking_lot::Mutex;
use std::sync::mpsc::{channel, Sender};

/// A job for a job thread.
pub type Job = Box<dyn FnOnce() + Send>;

static QUEUES: Mutex<Vec<(&'static str, Sender<Job>)>> = Mutex::new(Vec::new());

/// Queues `job` for the job thread `name`; gives it back when no thread
/// can be started (the caller then runs it, or drops it).
pub fn submit(name: &'static str, job: Job) -> Result<(), Job> {
    let mut queues = QUEUES.lock();
    let at = queues.iter().position(|(n, _)| *n == name);
    let job = match at {
        Some(i) => match queues[i].1.send(job) {
            Ok(()) => return Ok(()),
            // The thread is gone: start another.
            Err(e) => {
                queues.swap_remove(i);
                e.0
            }
        },
        None => job,
    };
    let (tx, rx) = channel::<Job>();
    let started = std::thread::Builder::new()
        .name(format!("vectide-{name}"))
        .spawn(move || {
            for job in rx {
                job();
            }
        });
    if started.is_err() {
        return Err(job);
    }
    let _ = tx.send(job);
    queues.push((name, tx));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    #[test]
    fn jobs_of_one_name_run_in_order_on_one_thread_and_names_apart() {
        let (tx, rx) = sync_channel(16);
        for i in 0..4 {
            let tx = tx.clone();
            submit(
                "test-a",
                Box::new(move || {
                    let name = std::thread::current().name().map(str::to_owned);
                    tx.send((i, name)).unwrap();
                }),
            )
            .unwrap_or_else(|_| panic!("no job thread"));
        }
        let tx2 = tx.clone();
        submit(
            "test-b",
            Box::new(move || {
                let name = std::thread::current().name().map(str::to_owned);
                tx2.send((9, name)).unwrap();
            }),
        )
        .unwrap_or_else(|_| panic!("no job thread"));
        let mut a = Vec::new();
        let mut b = Vec::new();
        for _ in 0..5 {
            let (i, name) = rx.recv().unwrap();
            match name.as_deref() {
                Some("vectide-test-a") => a.push(i),
                Some("vectide-test-b") => b.push(i),
                other => panic!("job {i} ran on {other:?}"),
            }
        }
        assert_eq!(a, [0, 1, 2, 3]);
        assert_eq!(b, [9]);
    }
}
