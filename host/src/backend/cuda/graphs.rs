//! Decode steps recorded once as CUDA graphs and replayed.

use std::collections::HashMap;

use anyhow::{Result, bail};

use super::{Cuda, CudaKvCache, CudaTensor, Recorded, StepFn, StepKey};
use crate::cuda::DBuf;

impl Cuda {
    /// Records `run` as the graph for step shape `key` (returns `None`: nothing ran yet). On
    /// failure (an op that cannot be recorded), recording is switched off for this backend and
    /// the step runs eagerly (returns its output).
    pub(super) fn record(
        &self,
        key: StepKey,
        cache: &mut CudaKvCache,
        run: &mut StepFn<Self>,
    ) -> Result<Option<CudaTensor>> {
        {
            let mut st = self.steps.borrow_mut();
            st.graphs.retain(|k, _| k.0 == key.0); // graphs of older caches address freed memory
            st.vocab = Some(0);
        }
        self.pool.borrow_mut().recording = Some(HashMap::new());
        let captured = self.gpu.capture(|| run(self, cache));
        let buffers: Vec<DBuf<f32>> = self
            .pool
            .borrow_mut()
            .recording
            .take()
            .unwrap_or_default()
            .into_values()
            .flatten()
            .collect();
        let vocab = self.steps.borrow_mut().vocab.take().unwrap_or(0);
        match captured {
            Ok((mut out, graph)) => {
                let (rows, cols) = (out.rows, out.cols);
                let buf = out.buf.take().expect("output buffer");
                self.steps.borrow_mut().graphs.insert(
                    key,
                    Recorded {
                        graph,
                        out: buf,
                        rows,
                        cols,
                        vocab,
                        _buffers: buffers,
                    },
                );
                Ok(None)
            }
            Err(e) => {
                // A buffer the pool lacked (e.g. the caller still holds the last step's logits)
                // is allocated by the eager run below, so the next step can try again; any
                // other failure, or repeated ones, switch recording off.
                let mut st = self.steps.borrow_mut();
                st.failures += 1;
                if st.failures >= 3 {
                    eprintln!(
                        "kiln: recording a decode step as a CUDA graph failed ({e:#}); decoding without graphs"
                    );
                    st.enabled = false;
                }
                drop(st);
                run(self, cache).map(Some)
            }
        }
    }

    /// Replays the recorded step `key` (tokens and position already in the step buffer) and
    /// returns a copy of its output.
    pub(super) fn replay(&self, key: StepKey, tokens: &[u32]) -> Result<CudaTensor> {
        let st = self.steps.borrow();
        let g = &st.graphs[&key];
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= g.vocab) {
            bail!(
                "token id {bad} is outside the vocabulary ({} rows)",
                g.vocab
            );
        }
        self.gpu.replay(&g.graph)?;
        let out = self.tensor(g.rows, g.cols)?;
        self.gpu
            .copy_range(&g.out, 0, out.buf(), 0, g.rows * g.cols)?;
        Ok(out)
    }
}
