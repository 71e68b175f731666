//! `kind = "flow"` recipes: flow-matching image models fine-tuned by Flow-GRPO/DDPO, LOOP and
//! RAM. The schema (`schema`), the MNIST digits (`digits`), the image job's parts (`images`:
//! pretraining, rewards, statistics, evaluation, sample grids) and the job (`job`).

pub mod digits;
pub mod images;
pub mod job;
pub mod schema;
