// A run's transcript kept from its stream (`projection=transcript`): each frame applied to
// the snapshot the stream opened with, as keel-api-types' `RunTranscript::apply` does, so a
// page follows the conversation without reading it again.

/** `transcript` with `frame` applied (a snapshot replaces it); the same object changed. */
export function applyFrame(transcript, frame) {
  if (frame.type === 'transcript_snapshot') return { ...frame.transcript, sequence: frame.sequence };
  if (!transcript) return transcript;
  transcript.sequence = frame.sequence;
  const turn = transcript.turns.find((t) => t.id === frame.turn_id);
  if (!turn) return transcript;
  switch (frame.type) {
    case 'block_started': {
      const after = frame.after_block_id === null || frame.after_block_id === undefined
        ? -1 : turn.blocks.findIndex((b) => b.id === frame.after_block_id);
      turn.blocks.splice(after + 1, 0, frame.block);
      break;
    }
    case 'block_delta':
    case 'block_completed': {
      const block = turn.blocks.find((b) => b.id === frame.block_id);
      // A patch replaces each part it names, absent ones with nothing.
      if (block) {
        for (const part of ['status', 'text', 'model_call', 'tool', 'approval', 'file_change', 'updated_at']) {
          block[part] = frame.patch[part] ?? null;
        }
      }
      break;
    }
    case 'turn_completed':
      transcript.answer = frame.answer ?? null;
      turn.status = frame.status;
      turn.updated_at = frame.updated_at;
      break;
    case 'turn_changed':
      turn.status = frame.status;
      turn.updated_at = frame.updated_at;
      break;
    default:
      break;
  }
  return transcript;
}
