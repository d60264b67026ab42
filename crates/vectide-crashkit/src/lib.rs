//! # vectide-crashkit
//!
//! The crash kit every durable engine runs in before it is called done, and
//! the database's collections with it (`vectide crash-test ENGINE` and
//! `vectide crash-test db:ENGINE`). It knows engines only through the
//! registry and the engine contract ([`subject`]), and a database collection
//! only through its public API, so a new engine runs in it with no code
//! here.
//!
//! - [`workload`]: the seeded operations (upserts with fresh vectors and
//!   deletes of one small shared set of labels).
//! - [`history`]: the oracle. Every operation is recorded at invocation and
//!   at acknowledgement on one clock; after a crash each label must hold the
//!   effect of an operation that may linearise last on it.
//! - [`sim`]: simulated crash states. The target runs in a scratch
//!   directory whose file syncs go through a file crash simulator
//!   (`vectide_storage::crashfs`) and whose persistent regions run on the
//!   cache-line crash simulator (`vectide_storage::SimMedia`); several
//!   writers run until a crash at a random sync or fence point; the
//!   post-crash image (unsynced tails kept, dropped or torn, pending lines
//!   kept, dropped or torn) is recovered and checked, and is the next
//!   round's start; a share of rounds also crashes during that recovery.
//!   With one persistence site switched off it is the mutation check
//!   ([`sim::mutation_check`]): dropping any one must be detected.
//! - [`kill`]: real processes killed with SIGKILL while several writers run.
//!
//! An acknowledgement means what the engine's persistence class promises:
//! for engines durable on acknowledgement the call returned; for engines
//! durable at flush the call and a `flush()` after it returned.

pub mod history;
pub mod kill;
pub mod sim;
pub mod subject;
pub mod workload;

pub use history::{History, SeqFrom, Tally};
pub use subject::{Subject, Target};
pub use vectide_storage::scratch_root;
