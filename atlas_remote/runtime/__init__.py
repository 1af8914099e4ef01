"""What every run of the library shares, below every other floor: progress bars (`progress`) and the lifetimes of
the processes it starts, none outliving its starter (`processes`)."""
