"""Data sources: recordings, metadata.csv, folders of class sub-folders, audio I/O."""
from wavetrain.data.audio import AUDIO_EXTENSIONS, AudioInfo, read_audio, read_info, write_audio
from wavetrain.data.dataset import FOLDER_LABEL, Dataset, load_dataset
from wavetrain.data.file_facts import use as use_file_facts
from wavetrain.data.metadata import read_metadata, write_metadata
from wavetrain.data.recording import Recording, file_content_hash

__all__ = ["AUDIO_EXTENSIONS", "FOLDER_LABEL", "AudioInfo", "Dataset", "Recording", "file_content_hash",
           "load_dataset", "read_audio", "read_info", "read_metadata", "use_file_facts", "write_audio",
           "write_metadata"]
